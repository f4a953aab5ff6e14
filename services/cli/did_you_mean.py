"""What `hoist` says to a command line it cannot parse, as git and kubectl do: one line on
stderr naming what is wrong, the nearest command, flag or choice (``did you mean 'ps'?``) and
the help to read; exit code 2, as argparse's own errors.

``HoistParser`` is the parser of `hoist` and of each of its subcommands (argparse gives a
subparser its parent's class)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

_CHOICE = re.compile(r"^argument (?P<arg>.+?): invalid choice: (?P<value>'.*?'|\S+)")
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def nearest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` if one is close enough (difflib's ratio >= 0.6)."""
    found = difflib.get_close_matches(word, list(candidates), n=1)
    return found[0] if found else None


class HoistParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line with a nearest match and the help to read."""

    _given: list[str]

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)  # for error(): its flags
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # said by the parser of the command they were given to, in its terms
            leaf = innermost(self, parsed)
            if not isinstance(leaf, HoistParser):
                leaf = self
            flags = [w for w in extras if _is_flag(w)]
            if flags:
                leaf.fail(leaf.unknown_flag(flags[0]))
            leaf.fail(f"unexpected argument {' '.join(extras)!r} for {leaf.prog}")
        return parsed

    def error(self, message: str) -> NoReturn:
        """argparse's errors: an unknown flag among the words given is the first thing to
        say (a misspelt flag also leaves a positional missing), then a wrong choice."""
        unknown = [w for w in self._flags_given() if not self._knows(w)]
        if unknown:
            self.fail(self.unknown_flag(unknown[0]))
        if m := _CHOICE.match(message):
            self.fail(self._bad_choice(m["arg"], m["value"].strip("'")))
        self.fail(message.removeprefix("argument "))  # "--max-wait: 'soon': give seconds ..."

    def fail(self, message: str) -> NoReturn:
        """One line on stderr: the message and the help to read; exit 2."""
        stop = " " if message.endswith("?") else ". "
        self.exit(2, f"hoist: {message}{stop}See `{self.prog} --help`.\n")

    def unknown_flag(self, word: str) -> str:
        flag = word.split("=", 1)[0]
        said = f"unknown flag {flag} for {self.prog}"
        if near := nearest(flag, self._option_string_actions):
            return f"{said}; did you mean {near}?"
        if any(a.dest == "words" for a in self._actions):  # run, exec: the command's own flags
            said += f" (a command with options goes after `--`: {self.prog} ... -- CMD ARGS)"
        return said

    def _bad_choice(self, arg: str, value: str) -> str:
        action = next((a for a in self._actions if _names(a) == arg), None)
        choices = [str(c) for c in (action.choices or ())] if action else []
        if isinstance(action, argparse._SubParsersAction):
            said = f"{value!r} is not a {self.prog} command"
        else:
            said = f"{arg} takes one of {', '.join(choices)}, not {value!r}"
        if near := nearest(value, choices):
            said += f"; did you mean {near!r}?"
        return said

    def _flags_given(self) -> list[str]:
        """The words given to this parser that argparse takes for flags (before ``--``)."""
        given = getattr(self, "_given", [])
        words = given[: given.index("--")] if "--" in given else given
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            words = words[: next((i for i, w in enumerate(words) if self._is_command(w)), None)]
        return [w for w in words if _is_flag(w)]

    def _is_command(self, word: str) -> bool:
        return any(
            isinstance(a, argparse._SubParsersAction) and word in (a.choices or {})
            for a in self._actions
        )

    def _knows(self, word: str) -> bool:
        """A flag of this parser as argparse reads one: ``--name``, ``--name=value``, a unique
        start of a long name, ``-x`` with its value or more short flags attached."""
        name = word.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        if name.startswith("--"):
            return any(s.startswith(name) for s in self._option_string_actions)
        return word[:2] in self._option_string_actions


def innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` came from (`hoist admin cancel-kernel`'s own)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or name not in (subs[0].choices or {}):
            return parser
        parser = subs[0].choices[name]


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NUMBER.match(word)


def _names(action: argparse.Action) -> str:
    """How argparse names an action in its messages: ``-n/--cluster-size``, or its dest."""
    if action.option_strings:
        return "/".join(action.option_strings)
    if action.metavar not in (None, argparse.SUPPRESS):
        return str(action.metavar)
    return str(action.dest)
