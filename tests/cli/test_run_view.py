"""`hoist run` and `hoist watch` against a real stack (nats-server, manager, two dummy agents):
the live view in a real terminal (tmux), status lines without one, re-attaching."""

from __future__ import annotations

import re

from tests.cli.stack_harness import HOIST, Stack, Terminal, wait_for

SESSION_PERCENT = re.compile(r"all agents\s.*?(\d+\.\d) %")
LAYER_LINE = re.compile(r"^\s+([0-9a-f]{12})\s+Downloading\s.*?(\d+\.\d) MiB / (\d+\.\d) MiB", re.M)
KERNEL_LINE = re.compile(r"^\s+kernel ([0-9a-f]{12}) ")
CREATED = re.compile(r"session ([0-9a-f]{32}) created")


def _record_until(terminal: Terminal, marker: str, timeout: float) -> list[str]:
    """Screens until one matches the regex ``marker``."""
    screens: list[str] = []

    def done() -> bool:
        screens.append(terminal.screen())
        return re.search(marker, screens[-1]) is not None

    wait_for(done, timeout, interval=0.15)
    return screens


def test_run_in_a_terminal_shows_layer_bars_and_a_session_bar_to_100_then_running(
    hoist_stack: Stack, terminal: Terminal
) -> None:
    # ~10 s of pull, 2.5 s a layer: a layer's bar is seen at several byte counts even when a
    # loaded host starts `hoist` late or captures the screen slowly.
    image = hoist_stack.next_big_image()
    # A process in a terminal (tmux): the live view a person sees.
    terminal.type(
        f"{HOIST} --data-dir {hoist_stack.data_dir} run {image} --cluster-size 2; echo EXIT=$?"
    )
    screens = _record_until(terminal, r"EXIT=\d", 90)
    final = screens[-1]

    # Layer bars that advance: one layer seen at growing byte counts.  Both agents pull the
    # same layers: a line is known by its layer and the kernel it is under, else two agents'
    # counts interleave (one a step behind the other on a loaded host).
    layers: dict[tuple[str, str], list[float]] = {}
    for screen in screens:
        kernel = ""
        for line in screen.splitlines():
            if m := KERNEL_LINE.match(line):
                kernel = m[1]
            elif m := LAYER_LINE.match(line):
                layers.setdefault((kernel, m[1]), []).append(float(m[2]))
    seen = sorted({line for s in screens for line in s.splitlines() if "Downloading" in line})
    assert any(len(set(v)) >= 2 and v == sorted(v) for v in layers.values()), (
        f"{len(screens)} screens; layer lines seen: {seen[:40]}; last: {final}"
    )
    assert any("━" in s and "MiB/s" in s and "ETA" in s for s in screens)

    # The session bar across both agents: advances, reaches 100 %.  (Not monotonic: a dummy
    # agent reveals a layer only when its download starts, so the known total grows.)
    percents = [float(p) for s in screens for p in SESSION_PERCENT.findall(s)]
    assert len({p for p in percents if 0 < p < 100}) >= 2, percents
    assert percents[-1] == 100.0

    # Both kernels, one on each agent (dispersed), end RUNNING; so does the command.
    session_id = CREATED.search(final)[1]  # type: ignore[index]
    assert re.search(r"kernel \w+\s+agent-1\s+RUNNING", final), final
    assert re.search(r"kernel \w+\s+agent-2\s+RUNNING", final), final
    assert f"session {session_id} RUNNING running" in final
    assert "EXIT=0" in final


def test_in_an_80_column_terminal_rates_and_etas_stay_on_their_lines(hoist_stack: Stack) -> None:
    """Issue 38, item 7: the bars go and the names shorten; no line wraps, and a layer's and the
    session's rate and ETA are on their own lines, beside their bytes."""
    term = Terminal(width=80)
    try:
        image = hoist_stack.next_medium_image()
        term.type(f"{HOIST} --data-dir {hoist_stack.data_dir} run {image} -n 2; echo EXIT=$?")
        screens = _record_until(term, r"EXIT=\d", 60)
    finally:
        term.close()
    layer = re.compile(
        r"^    [0-9a-f]{8} +Downloading +[\d.]+ MiB/[\d.]+ MiB +[\d.]+ MiB/s ETA \d:", re.M
    )
    total = re.compile(r"^  all agents .*%.* MiB/s ETA \d:\d\d:\d\d", re.M)
    assert any(layer.search(s) for s in screens), screens[-1]
    assert any(total.search(s) for s in screens), screens[-1]
    # What tmux shows is cut at 80 columns: a line that ran over would wrap onto the next,
    # which then starts with none of the view's own beginnings.
    starts = ("session ", "  kernel ", "    ", "  all agents")
    for screen in screens:
        view = screen.partition(" created (Ctrl-C detaches; it goes on)\n")[2]
        view = view.partition("EXIT=")[0]
        for line in view.splitlines():
            if line.strip():
                assert line.startswith(starts), screen
    assert "EXIT=0" in screens[-1]


def test_run_without_a_terminal_prints_status_lines(hoist_stack: Stack) -> None:
    image = hoist_stack.next_medium_image()  # a pull long enough to be watched from its start
    result = hoist_stack.hoist(
        "run", image, "--cluster-size", "2", "-r", "cpu=0.5", "-r", "mem=256m"
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b[" not in out and "━" not in out  # no redrawing, no bars
    session_id = CREATED.search(out)[1]  # type: ignore[index]
    assert len(re.findall(r"kernel \w+ agent-\d PULLING", out)) == 2, out
    assert "pull 100% 480.0 MiB / 480.0 MiB across all agents" in out
    assert len(re.findall(r"kernel \w+ agent-\d RUNNING running", out)) == 2, out
    assert out.rstrip().endswith(f"session {session_id} RUNNING running")
    history = hoist_stack.hoist("history", session_id).stdout
    assert '"resources":{"cpu":0.5,"mem":268435456}' in history


def test_ctrl_c_detaches_and_watch_shows_the_current_state_at_once(
    hoist_stack: Stack, terminal: Terminal
) -> None:
    image = hoist_stack.next_big_image()
    dd = hoist_stack.data_dir
    # A process in a terminal: Ctrl-C is a real SIGINT, the view a real one.
    terminal.type(f"{HOIST} --data-dir {dd} run {image} --cluster-size 2; echo EXIT=$?")
    screens = _record_until(terminal, "Downloading", 60)
    session_id = CREATED.search(screens[-1])[1]  # type: ignore[index]
    terminal.ctrl_c()
    detached = _record_until(terminal, r"EXIT=\d", 20)[-1]
    assert f"detached from session {session_id}" in detached
    assert "EXIT=0" in detached

    # The session went on without the watcher: it is still pulling (or done with it).
    terminal.clear()
    terminal.type(f"{HOIST} --data-dir {dd} watch {session_id}; echo EXIT=$?")
    screens = _record_until(terminal, f"session {session_id}  .*\n", 20)
    first = screens[-1]
    # Its first frame already has both kernels on their agents and a non-empty session bar.
    assert re.search(r"kernel \w+\s+agent-1\s", first), first
    assert re.search(r"kernel \w+\s+agent-2\s", first), first
    first_percent = float(SESSION_PERCENT.findall(first)[0])
    assert first_percent > 0, first
    final = _record_until(terminal, r"EXIT=\d", 60)[-1]
    assert f"session {session_id} RUNNING running" in final and "EXIT=0" in final

    # Without a terminal, watching a running session answers at once.
    result = hoist_stack.hoist("watch", session_id, timeout=20)
    assert result.returncode == 0
    assert result.stdout.rstrip().endswith(f"session {session_id} RUNNING running")
    assert "pull 100%" in result.stdout


def test_ctrl_c_while_a_command_waits_for_its_pull_exits_130(
    hoist_stack: Stack, terminal: Terminal
) -> None:
    """`hoist run IMAGE -- CMD` follows the command's output once it runs, and Ctrl-C then
    exits 130; so does Ctrl-C before, while the image is pulled (it exited 0 there)."""
    image = hoist_stack.next_big_image()
    dd = hoist_stack.data_dir
    # A process in a terminal: Ctrl-C is a real SIGINT, 130 the shell's $?.
    terminal.type(f"{HOIST} --data-dir {dd} run {image} -- sleep 30; echo EXIT=$?")
    screens = _record_until(terminal, "Downloading", 60)
    session_id = CREATED.search(screens[-1])[1]  # type: ignore[index]
    terminal.ctrl_c()
    detached = _record_until(terminal, r"EXIT=\d", 20)[-1]
    assert f"detached from session {session_id}" in detached
    assert "EXIT=130" in detached, detached


def test_detach_returns_at_once_and_max_wait_bounds_a_watch(hoist_stack: Stack) -> None:
    image = hoist_stack.next_big_image()
    created = hoist_stack.hoist("run", image, "--detach")
    assert created.returncode == 0, created.stderr
    session_id, status = created.stdout.split()[1:3]
    assert status in ("PENDING", "SCHEDULED", "PREPARING", "PULLING")

    waited = hoist_stack.hoist("watch", session_id, "--max-wait", "1")
    assert waited.returncode == 2
    assert f"session {session_id} still PULLING (image-pulling) after 1s" in waited.stdout
    assert f"re-attach with `hoist watch {session_id}`" in waited.stdout
