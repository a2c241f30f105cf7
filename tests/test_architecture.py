"""The layout holds: no import cycle between library modules, no private name imported across packages.

Every module of ``distlock``, ``distlock_django``, ``distlock_sqla``, ``benchmarks`` and ``faults`` is parsed (not
imported) with ``ast``. An import counts wherever it is written — at module level or inside a function — except under
``if TYPE_CHECKING:``, which never runs. ``distlock.celery`` counts as a package of its own: like the other
integrations it may use only public ``distlock`` names. Benchmark modules share code through the modules of
``benchmarks/_harness/`` (one per concern), whose names without a leading underscore are public to the benchmarks and
to one another; the harness imports no benchmark.

Each check is parametrized by package, so a failure names the area it is in.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ("distlock", "distlock_django", "distlock_sqla", "benchmarks", "faults")
#: The packages the private-name rule is about: a subpackage named here is a package of its own.
PACKAGES = ("distlock", "distlock.celery", "distlock_django", "distlock_sqla", "benchmarks", "faults")


@dataclass(frozen=True)
class Import:
    """One imported module, and the names taken from it (empty for ``import x``)."""

    importer: str
    module: str
    names: tuple[str, ...]
    line: int

    def __str__(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.importer}:{self.line}: {what}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    modules = {}
    for top in TOP_LEVEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: the ones under ``if TYPE_CHECKING:`` are skipped (not their else)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _statements(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _statements(node)


def _imports(module: str, path: Path) -> Iterator[Import]:
    is_package = path.name == "__init__.py"
    for node in _statements(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, (), node.lineno)
            continue
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = package[: len(package) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        yield Import(module, target, tuple(alias.name for alias in node.names), node.lineno)


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _package(module: str) -> str:
    return max((p for p in PACKAGES if module == p or module.startswith(p + ".")), key=len, default="")


def _graph() -> dict[str, set[str]]:
    """Library module -> the library modules it imports (``from pkg import submodule`` counts as the submodule)."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in IMPORTS:
        targets = {f"{imp.module}.{name}" for name in imp.names if f"{imp.module}.{name}" in MODULES}
        if not imp.names or len(targets) < len(imp.names):
            targets.add(imp.module)  # names that are not submodules come from the module itself
        graph[imp.importer] |= {target for target in targets if target in MODULES and target != imp.importer}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan, then a path)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to the start
        node = frontier.pop(0)
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                frontier.append(nxt)
    raise AssertionError(f"no cycle in component {component}")


def test_the_modules_are_found() -> None:
    assert {"distlock", "distlock._lock", "distlock.backends.etcd._backend", "distlock_django", "distlock_sqla"} <= set(
        MODULES
    )
    assert any(module.startswith("benchmarks.") for module in MODULES)


@pytest.mark.parametrize("package", TOP_LEVEL)
def test_no_import_cycle(package: str) -> None:
    cycles = [cycle for cycle in _cycles(_graph()) if any(_package(m).split(".")[0] == package for m in cycle)]
    assert not cycles, "import cycle(s):\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def _private_crossing(imp: Import) -> bool:
    source, target = _package(imp.importer), _package(imp.module)
    if not target or source == target:
        return False
    module_private = any(part.startswith("_") for part in imp.module.split("."))
    return module_private or any(name.startswith("_") for name in imp.names)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_is_imported_across_packages(package: str) -> None:
    crossing = [str(imp) for imp in IMPORTS if _package(imp.importer) == package and _private_crossing(imp)]
    assert not crossing, f"{package} imports private names of another package:\n" + "\n".join(crossing)


def test_benchmarks_share_only_public_names() -> None:
    private = [
        str(imp)
        for imp in IMPORTS
        if _package(imp.importer) == "benchmarks" == _package(imp.module)
        and any(name.startswith("_") for name in imp.names)
    ]
    assert not private, "benchmark modules import private names of other benchmark modules:\n" + "\n".join(private)


def _harness_imports_a_benchmark(imp: Import) -> bool:
    harness = "benchmarks._harness"
    inside = imp.importer == harness or imp.importer.startswith(harness + ".")
    # ``from benchmarks import etcd_locks`` imports the module named after the package
    target = ".".join([imp.module, *imp.names[:1]]) if imp.module == "benchmarks" else imp.module
    return inside and target.startswith("benchmarks.") and not target.startswith(harness)


def test_the_benchmark_harness_imports_no_benchmark() -> None:
    upward = [str(imp) for imp in IMPORTS if _harness_imports_a_benchmark(imp)]
    assert not upward, "the benchmark harness imports a benchmark:\n" + "\n".join(upward)


def test_the_rules_catch_what_they_are_for() -> None:
    """The checks above would see a violation: a cycle, a private import across packages, a TYPE_CHECKING import."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _private_crossing(Import("distlock_sqla._ops", "distlock._errors", ("ConfigurationError",), 1))
    assert _private_crossing(Import("distlock.celery._task", "distlock", ("_held",), 1))
    assert _private_crossing(Import("distlock.celery._task", "distlock._lock", ("Lock",), 1))
    assert not _private_crossing(Import("distlock.celery._task", "distlock", ("Lock",), 1))
    assert not _private_crossing(Import("distlock._lock", "distlock._fence", ("Fence",), 1))
    assert not _private_crossing(Import("benchmarks.redis_locks", "benchmarks._harness.run", ("Run",), 1))
    assert _harness_imports_a_benchmark(Import("benchmarks._harness.locks", "benchmarks.etcd_locks", ("Lock",), 1))
    assert _harness_imports_a_benchmark(Import("benchmarks._harness.locks", "benchmarks", ("etcd_locks",), 1))
    assert not _harness_imports_a_benchmark(Import("benchmarks._harness.timing", "benchmarks._harness.figures", (), 1))
    assert not _harness_imports_a_benchmark(Import("benchmarks.etcd_locks", "benchmarks._harness.run", ("Run",), 1))
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n")
    assert [ast.unparse(node) for node in _statements(tree)] == ["from typing import TYPE_CHECKING", "import b"]
