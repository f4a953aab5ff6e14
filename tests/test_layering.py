"""The layers hold: the CLI loads nothing of the manager, Hoist's modules import each other in no
cycle, and the import-linter contracts in pyproject.toml are kept."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

from domain.contracts.queries import FILTERS
from domain.subjects import QUERY_NAMES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("domain", "transport", "eventstore", "projections", "agent", "client", "services")
CLI_MODULES = (
    "services.cli.main",
    "services.cli.images",
    "services.cli.audit",
    "services.cli.read",
    "services.cli.progress_view",
    "client.connection",
    "services.cli.stack_url",
)


def test_the_cli_loads_no_manager_module() -> None:
    script = (
        "import importlib, sys\n"
        f"for name in {CLI_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(m for m in sys.modules"
        " if m == 'services.manager' or m.startswith('services.manager.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == []


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def test_tarjan_finds_cycles() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"]}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"], ["e"]]


def test_no_import_cycle_among_hoists_modules() -> None:
    # grimp counts every import: inside functions and TYPE_CHECKING blocks too.
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    cycles = [c for c in strongly_connected(imports) if len(c) > 1]
    assert not cycles, "import cycles (each list imports itself round): " + repr(cycles)


def test_import_linter_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_query_contract_names_every_query_the_manager_serves() -> None:
    from services.manager.queries import QUERIES

    assert sorted(QUERIES) == sorted(QUERY_NAMES) == sorted(FILTERS)
    assert all(QUERIES[name].filters == FILTERS[name] for name in QUERY_NAMES)
