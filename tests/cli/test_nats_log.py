"""nats-server's log rotates (nats.conf: 10 MB, three old files): `hoist user add` and `hoist
certs rotate` still see the reload they wait for when the log rotated meanwhile (a flood of
refused publishes rotates it every second)."""

from __future__ import annotations

from pathlib import Path

from services.stack.up import _RELOADED, _log_mark, _logged_since


def test_a_reload_logged_after_a_rotation_is_seen_and_an_old_one_is_not(tmp_path: Path) -> None:
    log = tmp_path / "nats-server.log"
    old = tmp_path / "nats-server.log.2026.12.06.05.00.00.000000001"
    old.write_text(f"[1] {_RELOADED}\n")  # an earlier reload, rotated away before
    log.write_text(f"[1] {_RELOADED}\n[1] Publish Violation\n")
    mark = _log_mark(log)
    assert _RELOADED not in _logged_since(log, mark)  # what was there before counts for nothing

    with log.open("a") as f:
        f.write("[1] Publish Violation\n")
    log.rename(tmp_path / "nats-server.log.2026.12.06.05.00.01.000000001")  # rotated
    log.write_text("[1] Publish Violation\n")
    assert _RELOADED not in _logged_since(log, mark)

    log.write_text(f"[1] Publish Violation\n[1] {_RELOADED}\n")  # in the new file
    assert _RELOADED in _logged_since(log, mark)


def test_a_reload_logged_just_before_the_rotation_is_seen(tmp_path: Path) -> None:
    log = tmp_path / "nats-server.log"
    log.write_text("[1] Publish Violation\n")
    mark = _log_mark(log)
    with log.open("a") as f:
        f.write(f"[1] {_RELOADED}\n")
    log.rename(tmp_path / "nats-server.log.2026.12.06.05.00.01.000000001")
    log.write_text("")
    assert _RELOADED in _logged_since(log, mark)
