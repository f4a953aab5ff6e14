"""The README a newcomer reads (issue 15, item 10): the two commands first, then a five-minute
tour of what a second terminal does, then the reference; internals and benchmarks live in
docs/.  Its commands are the CLI's own: each ``hoist <command>`` the tour shows exists."""

from __future__ import annotations

import re
from pathlib import Path

from services.cli.main import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_the_two_commands_then_the_tour_then_the_reference() -> None:
    text = README.read_text()
    first_block = text.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line]
    assert commands == ["./dev up", "./dev test"]
    sections = _sections(text)
    assert sections[0] == "A five-minute tour", sections
    assert sections.index("Running work in kernels") == 1, sections
    for internal in ("Layout", "Benchmarks", "Architecture"):
        assert internal not in sections, f"{internal} belongs in docs/"
    assert len(text.splitlines()) < 400  # it was 613 lines, with the CLI near line 390


def test_every_command_of_the_tour_exists() -> None:
    text = README.read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    shown = set(re.findall(r"^hoist (\w[\w-]*)", tour, flags=re.M))
    assert {"run", "watch", "ps", "logs", "history", "down", "status"} <= shown, shown
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert shown <= set(sub.choices), shown - set(sub.choices)
