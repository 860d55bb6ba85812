"""Import structure of pdopt: every module imports on its own, and imports run one way.

``test_every_module_imports_in_a_fresh_interpreter`` imports each module (found with
:mod:`pkgutil`, without importing anything) in a process where no pdopt module was ever
imported: one driver interpreter imports only the third-party packages pdopt's modules import
at module level, then forks one child per pdopt module (a few at a time), so a module that
works only when another pdopt module happens to be imported first fails, naming itself.
``pdopt.__main__`` is left out: importing it runs the command.

NOTE: forking from a driver that has already paid for numpy, pandas, numba and friends costs
a few ms per module instead of the ~1 s of a fresh ``python -c`` each. The price: a module
using a third-party submodule it never imports itself (``scipy.stats`` after ``import scipy``)
could pass here when another module's import of it is pre-loaded.

The graph tests read every module's imports with :mod:`ast`: module-level and function-level
(deferred) imports, absolute and relative; ``from pdopt.x import y`` is an edge to
``pdopt.x.y`` when that is a module, else to ``pdopt.x``. Importing ``pdopt.x.y`` from outside
``pdopt.x`` also runs ``pdopt.x/__init__``, so it is an edge to ``pdopt.x`` too, and a package's
``__init__`` re-exports are edges from the package. Imports under ``if TYPE_CHECKING:`` never
run and are left out; so are imports by a computed name (the CLI's sub-commands,
``importlib.import_module(f"pdopt.cli._{name}")``). The module graph must have no cycle, and
at every level of the package tree the children of a package (its modules and sub-packages,
each sub-package standing for everything under it) must have none either.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import pkgutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pdopt"
NOT_IMPORTED = {"pdopt.__main__": "importing it runs the command"}


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package a relative import in this module starts from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _walk(path: Path, prefix: str) -> Iterator[Module]:
    for info in pkgutil.iter_modules([str(path)]):
        name = prefix + info.name
        if info.ispkg:
            yield Module(name, path / info.name / "__init__.py", True)
            yield from _walk(path / info.name, name + ".")
        else:
            yield Module(name, path / f"{info.name}.py", False)


def pdopt_modules() -> dict[str, Module]:
    """Every module and package of pdopt, by name (nothing imported)."""
    modules = [Module("pdopt", PACKAGE / "__init__.py", True), *_walk(PACKAGE, "pdopt.")]
    return {m.name: m for m in modules}


# ----------------------------------------------------------------------------------------------
# every module imports alone

_DRIVER = """
import importlib, json, multiprocessing, os, sys, traceback
root, third_party, names = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, root)
for name in third_party:
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # an optional dependency: the child that needs it reports it
assert not [m for m in sys.modules if m.split(".")[0] == "pdopt"]

def try_import(name):
    try:
        module = importlib.import_module(name)
    except BaseException:
        return name, traceback.format_exc()
    if not module.__file__.startswith(root + os.sep):
        return name, f"imported from {module.__file__}, not from {root}"
    return name, ""

if __name__ == "__main__":
    # one fresh fork per module (maxtasksperchild=1)
    workers = min(4, os.cpu_count() or 1)
    with multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=1) as pool:
        print(json.dumps(dict(pool.map(try_import, names, chunksize=1))))
"""


def _third_party_imports(modules: dict[str, Module]) -> list[str]:
    """The non-pdopt modules pdopt's modules import at module level (pre-loaded by the driver)."""
    found: set[str] = set()
    for m in modules.values():
        for node in ast.parse(m.path.read_text(), str(m.path)).body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
    return sorted(n for n in found if n.split(".")[0] != "pdopt" and n != "__future__")


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    modules = pdopt_modules()
    names = [n for n in modules if n not in NOT_IMPORTED]
    assert len(names) > 50  # the walk found the package
    args = [ROOT, json.dumps(_third_party_imports(modules)), json.dumps(names)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, *map(str, args)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    errors = json.loads(out.stdout.splitlines()[-1])
    assert sorted(errors) == sorted(names)
    failed = {n: e for n, e in errors.items() if e}
    assert not failed, "\n".join(f"{n} does not import on its own:\n{e}" for n, e in failed.items())


# ----------------------------------------------------------------------------------------------
# the import graph


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (any depth), skipping ``if TYPE_CHECKING:`` bodies."""
    if isinstance(tree, ast.Import | ast.ImportFrom):
        yield tree
        return
    if isinstance(tree, ast.If) and _is_type_checking(tree.test):
        for node in tree.orelse:
            yield from _runtime_imports(node)
        return
    for node in ast.iter_child_nodes(tree):
        yield from _runtime_imports(node)


def _targets(node: ast.Import | ast.ImportFrom, module: Module) -> Iterator[str]:
    """The modules an import statement names (pdopt or not)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.package.split(".")
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    yield base
    yield from (f"{base}.{a.name}" for a in node.names)


def _explicit(
    node: ast.Import | ast.ImportFrom, module: Module, modules: dict[str, Module]
) -> list[str]:
    """The pdopt modules a statement imports: ``from a import b`` is ``a.b`` when that is a
    module, else ``a`` (whose ``__init__`` defines ``b``)."""
    base, *names = _targets(node, module)
    if isinstance(node, ast.Import):
        found = [base, *names]
    else:
        found = [n for n in names if n in modules]
        if len(found) < len(names):
            found.append(base)
    return [n for n in found if n.split(".")[0] == "pdopt"]


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


Graph = dict[str, dict[str, str]]  # module -> imported module -> where ("file:line")


def import_graph(modules: dict[str, Module]) -> Graph:
    """The runtime import graph between pdopt modules (module docstring)."""
    graph: Graph = {name: {} for name in modules}
    for m in modules.values():
        tree = ast.parse(m.path.read_text(), str(m.path))
        own = {m.name, *_ancestors(m.name)}
        for node in _runtime_imports(tree):
            where = f"{m.path.relative_to(ROOT)}:{node.lineno}"
            for target in _explicit(node, m, modules):
                assert target in modules, f"{where} imports {target}, which does not exist"
                # the target itself, and the packages its import runs on the way there
                for t in (target, *(a for a in _ancestors(target) if a not in own)):
                    if t != m.name:
                        graph[m.name].setdefault(t, where)
    return graph


def collapse(graph: Graph, package: str) -> Graph:
    """The graph between the children of ``package``, each child standing for all under it."""
    prefix = package + "."

    def child(name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        return prefix + name.removeprefix(prefix).split(".")[0]

    out: Graph = defaultdict(dict)
    for a, targets in graph.items():
        ca = child(a)
        if ca is None:
            continue
        out[ca]
        for b, where in targets.items():
            cb = child(b)
            if cb is not None and cb != ca:
                out[ca].setdefault(cb, where)
    return dict(out)


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first node (breadth-first)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a cycle")


def describe(cycle: list[str], graph: Graph) -> str:
    return "\n".join(f"  {a} -> {b}  ({graph[a][b]})" for a, b in itertools.pairwise(cycle))


def _assert_acyclic(graph: Graph, what: str) -> None:
    cycles = find_cycles(graph)
    text = "\n".join(f"import cycle {what}:\n{describe(c, graph)}" for c in cycles)
    assert not cycles, text


def format_graph(graph: Graph) -> str:
    """One line per node, dependencies first (a topological order)."""
    done: list[str] = []

    def visit(v: str) -> None:
        if v not in done:
            for w in sorted(graph[v]):
                visit(w)
            done.append(v)

    for v in sorted(graph):
        visit(v)
    return "\n".join(f"{v} -> {', '.join(sorted(graph[v])) or '(nothing)'}" for v in done)


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph(pdopt_modules())
    assert graph["pdopt.tune"]  # the walk saw the re-exports
    _assert_acyclic(graph, "between modules")


def test_no_import_cycle_between_packages() -> None:
    modules = pdopt_modules()
    graph = import_graph(modules)
    for package in sorted(n for n, m in modules.items() if m.is_package):
        _assert_acyclic(collapse(graph, package), f"between the children of {package}")
    top = {
        a.removeprefix("pdopt."): {b.removeprefix("pdopt.") for b in targets}
        for a, targets in collapse(graph, "pdopt").items()
    }
    print(format_graph({a: dict.fromkeys(b, "") for a, b in top.items()}))


def test_the_graph_checks_see_cycles_and_deferred_imports() -> None:
    """The checker itself: a function-level import is an edge; a cycle is found and printed."""
    source = "def f():\n    from pdopt.b import g\n"
    tree = ast.parse(source)
    (node,) = _runtime_imports(tree)
    assert list(_targets(node, Module("pdopt.a", Path("a.py"), False))) == ["pdopt.b", "pdopt.b.g"]
    guarded = ast.parse("if TYPE_CHECKING:\n    import pdopt.b\nelse:\n    import pdopt.c\n")
    (kept,) = _runtime_imports(guarded)
    assert isinstance(kept, ast.Import) and kept.names[0].name == "pdopt.c"
    graph: Graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:2"}, "c": {"a": "c.py:3"}, "d": {}}
    (cycle,) = find_cycles(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert "b -> c  (b.py:2)" in describe(cycle, graph)
    assert find_cycles({"a": {"b": ""}, "b": {}}) == []
