"""domain.dotfiles: a user's dotfiles set, replaced and removed as events; bad paths, sizes,
counts and modes refused naming the field, recording nothing."""

from __future__ import annotations

import pytest

from domain import events as ev
from domain import rpc
from domain.admission import fold
from domain.dotfiles import Dotfile, Dotfiles
from domain.errors import InvalidField, NotFound
from domain.limits import (
    MAX_DOTFILE,
    MAX_DOTFILE_PATH,
    MAX_DOTFILES,
    MAX_DOTFILES_BYTES,
    MAX_REQUEST,
)
from domain.subjects import DOTFILES, MANAGER_KINDS, aggregate_subject


def _set(d: Dotfiles | None, path: str, content: bytes = b"x", mode: int = 0o644) -> Dotfiles:
    return Dotfiles.set(d, owner="alice", path=path, content=content, mode=mode, by="alice")


def test_set_replace_same_again_and_remove() -> None:
    d = _set(None, ".bashrc", b"alias ll='ls -l'\n")
    _set(d, ".config/git/config", b"[user]\n", 0o600)
    assert d.listed() == [
        Dotfile(".bashrc", b"alias ll='ls -l'\n"),
        Dotfile(".config/git/config", b"[user]\n", 0o600),
    ]
    assert _set(d, ".bashrc", b"alias ll='ls -l'\n") is d
    assert len(d.pending_events) == 2  # the same file again: nothing new
    _set(d, ".bashrc", b"set -o vi\n")
    assert d.files[".bashrc"].content == b"set -o vi\n"
    d.remove(".bashrc", by="admin")
    assert [f.path for f in d.listed()] == [".config/git/config"] and d.by == "admin"
    with pytest.raises(NotFound, match="path"):
        d.remove(".bashrc", by="alice")
    events = d.collect_events()
    assert [type(e) for e in events] == [ev.DotfileSet] * 3 + [ev.DotfileRemoved]
    # Every reader folds them so: a set again is no second start.
    subject = aggregate_subject(DOTFILES, "alice")
    folded = None
    for e in events:
        folded = fold(folded, e, subject)
    assert isinstance(folded, Dotfiles) and folded.listed() == d.listed()
    assert DOTFILES in MANAGER_KINDS


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "relative to the home"),
        ("/etc/passwd", "relative to the home"),
        ("~/.bashrc", "relative to the home"),
        ("../x", "'..'"),
        (".config/../../x", "'..'"),
        ("a//b", "empty or '.' step"),
        ("a/", "empty or '.' step"),
        ("./a", "empty or '.' step"),
        ("a\x00b", "NUL"),
        ("a\nb", "printable"),
        ("x" * 256, "at most 255 bytes"),
    ],
)
def test_bad_paths_are_refused_naming_path(path: str, why: str) -> None:
    d = _set(None, ".profile")
    with pytest.raises(InvalidField, match="path") as info:
        _set(d, path)
    assert info.value.field == "path" and why in str(info.value)
    assert len(d.collect_events()) == 1  # nothing recorded


def test_too_big_too_many_too_much_and_bad_modes_are_refused() -> None:
    _set(None, "a", b"x" * MAX_DOTFILE)  # the most one may hold
    with pytest.raises(InvalidField, match="more than 65536") as info:
        _set(None, "a", b"x" * (MAX_DOTFILE + 1))
    assert info.value.field == "content"
    d = _set(None, "f0")
    for i in range(1, MAX_DOTFILES):
        _set(d, f"f{i}")
    _set(d, "f0", b"replaced")  # replacing one is no 33rd
    with pytest.raises(InvalidField, match="32 dotfiles") as info:
        _set(d, "one-more")
    assert info.value.field == "path" and len(d.files) == MAX_DOTFILES
    big = _set(None, "b0", b"x" * MAX_DOTFILE)
    for i in range(1, MAX_DOTFILES_BYTES // MAX_DOTFILE):
        _set(big, f"b{i}", b"x" * MAX_DOTFILE)
    with pytest.raises(InvalidField, match="in all") as info:
        _set(big, "last", b"x")
    assert info.value.field == "content"
    for mode in (-1, 0o1000, 0o4755, True):
        with pytest.raises(InvalidField) as info:
            _set(None, ".bashrc", mode=mode)
        assert info.value.field == "mode"
    with pytest.raises(InvalidField) as info:
        Dotfiles.set(None, owner="a b", path=".bashrc", content=b"", by="client")
    assert info.value.field == "owner"


def test_the_most_dotfiles_fit_in_one_create_kernel_under_nats_max_payload() -> None:
    # 32 files of the longest paths, 384 KiB in all (base64 on the wire), with the rest of the
    # request at MAX_REQUEST: the agent takes it, and it is under nats.conf's 1 MB.
    each = MAX_DOTFILES_BYTES // MAX_DOTFILES
    dotfiles = [
        rpc.KernelDotfile(path=f"{i:02d}" + "p" * (MAX_DOTFILE_PATH - 2), content=b"\xff" * each)
        for i in range(MAX_DOTFILES)
    ]
    request = rpc.CreateKernel(
        kernel_id="k1",
        session_id="s1",
        image="127.0.0.1:5000/busybox:1",
        resources=ev.Resources(cpu=1.0, mem=2**30),
        dotfiles=dotfiles,
    )
    data = rpc.encode(request)
    padded = len(data) + MAX_REQUEST  # the spec, env and the rest at their most
    assert padded <= rpc.max_request(rpc.CREATE_KERNEL) < 1024 * 1024
    assert rpc.decode_request(rpc.CREATE_KERNEL, data).dotfiles == dotfiles
    with pytest.raises(rpc.RequestError, match="more than"):
        rpc.decode_request(rpc.DESTROY_KERNEL, b" " * (MAX_REQUEST + 1))


def test_a_file_and_a_folder_of_one_name_are_refused_and_paths_count_bytes() -> None:
    kept = Dotfiles.set(None, owner="ann", path=".bashrc", content=b"x", by="ann")
    kept = Dotfiles.set(kept, owner="ann", path=".config/git/config", content=b"y", by="ann")
    for path in (".bashrc/x", ".config", ".config/git"):  # under a file; over a file
        with pytest.raises(InvalidField, match="one would be a folder of the other"):
            Dotfiles.set(kept, owner="ann", path=path, content=b"z", by="ann")
    # A filesystem counts a name's bytes: 255 two-byte characters are 510.
    with pytest.raises(InvalidField, match="at most 255 bytes, got 510"):
        Dotfiles.set(None, owner="ann", path="\u00e9" * 255, content=b"x", by="ann")
