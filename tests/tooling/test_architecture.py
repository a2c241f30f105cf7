"""The layout holds: no import cycle between library modules, no private name imported across packages, no distlock
URL parsed outside the backends, no module too long to read, no handle reaching into its client, a narrow seam,
and ``distlock`` never imports the integrations or tools built on it.

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
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


#: What the library sits under: ``distlock`` (its pytest plugin included) imports none of these.
ABOVE_THE_LIBRARY = ("distlock_django", "distlock_sqla", "benchmarks", "faults")


def _upward(imp: Import) -> bool:
    return imp.importer.split(".")[0] == "distlock" and imp.module.split(".")[0] in ABOVE_THE_LIBRARY


def test_the_library_never_imports_its_integrations() -> None:
    upward = [str(imp) for imp in IMPORTS if _upward(imp)]
    assert not upward, "distlock imports a package built on it:\n" + "\n".join(upward)


def test_benchmarks_share_only_public_names() -> None:
    private = [
        str(imp)
        for imp in IMPORTS
        if _package(imp.importer) == "benchmarks" == _package(imp.module)
        and any(name.startswith("_") for name in imp.names)
    ]
    assert not private, "benchmark modules import private names of other benchmark modules:\n" + "\n".join(private)


#: The URL parsers of the standard library and SQLAlchemy: a module that reaches for one is parsing a URL.
URL_PARSERS = frozenset({"urlsplit", "urlparse", "parse_qs", "parse_qsl", "make_url"})
#: Where distlock URLs are parsed: the backends' grammars (the reference backend's, ``memory://``, uses their helpers).
URL_GRAMMARS = ("distlock.backends",)


def _url_parsing(module: str, source: str) -> list[str]:
    """Every import, call or mention of a URL parser in ``module``'s ``source`` (``module:line: name``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=module)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute | ast.Name):
            names = [node.attr if isinstance(node, ast.Attribute) else node.id]
        else:
            continue
        found += [f"{module}:{node.lineno}: {name}" for name in names if name.rpartition(".")[2] in URL_PARSERS]
    return found


@pytest.mark.parametrize("package", ["distlock", "distlock_django", "distlock_sqla"])
def test_no_url_is_parsed_outside_the_backends(package: str) -> None:
    """The library takes URLs only as distlock URLs, and their grammars live with the backends (``parse_url``): a
    URL parser anywhere else in the library would be a second grammar of one of them. Django's integration reads
    ``DATABASES`` (dicts, which it turns into a ``sql+`` URL with ``quote``) and its own ``django://<alias>`` (split
    at ``://``): neither needs a parser. Tests, benchmarks and scripts may parse what they like."""
    parsing = [
        found
        for module, path in MODULES.items()
        if module.split(".")[0] == package and not any(module == g or module.startswith(g + ".") for g in URL_GRAMMARS)
        for found in _url_parsing(module, path.read_text())
    ]
    assert not parsing, "URL parsing outside distlock.backends (use distlock.backends.parse_url):\n" + "\n".join(
        parsing
    )


#: The most lines a module of ``distlock`` may have: a file a reader can hold (issue 23, point 5).
MAX_LINES = 600


def test_no_module_is_longer_than_a_reader_can_hold() -> None:
    too_long = {
        f"{module}: {lines} lines"
        for module, path in MODULES.items()
        if module.split(".")[0] == "distlock" and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concern):\n" + "\n".join(sorted(too_long))


#: The modules of the handles a client makes (lock, semaphore, read/write lock, multi-lock, election): they reach
#: their client only through the ``Context`` they are given (``_context.py``).
HANDLE_MODULES = (
    "distlock._asynclock",
    "distlock._election",
    "distlock._lock",
    "distlock._lockoptions",
    "distlock._multi",
    "distlock._rwlock",
)
#: The client's private names a handle could reach for instead of its context.
CLIENT_PRIVATE = frozenset({"_backend", "_keeper", "_while_open", "_client"})


def _client_private_uses(module: str, source: str) -> list[str]:
    """Every use of a client's private name in ``module``'s ``source`` (``module:line: name``): an attribute in
    ``CLIENT_PRIVATE``, ``._context`` on anything but ``self`` (a handle's own context is ``self._context``), or the
    ``_client`` module imported."""
    found = []
    for node in ast.walk(ast.parse(source, filename=module)):
        if isinstance(node, ast.Attribute):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if node.attr in CLIENT_PRIVATE or (node.attr == "_context" and not on_self):
                found.append(f"{module}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in CLIENT_PRIVATE:
            found.append(f"{module}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom) and (
            (node.module or "").split(".")[-1] == "_client" or any(a.name == "_client" for a in node.names)
        ):
            found.append(f"{module}:{node.lineno}: import of _client")
    return found


def test_handles_reach_their_client_only_through_their_context() -> None:
    assert set(HANDLE_MODULES) <= set(MODULES)
    uses = [found for module in HANDLE_MODULES for found in _client_private_uses(module, MODULES[module].read_text())]
    assert not uses, "handle modules touching a client's private names (use the Context):\n" + "\n".join(uses)


def test_the_backend_protocol_stays_narrow() -> None:
    """``Backend`` has exactly these members (annotations and methods); why each exists is in its docstring. A new
    member widens the seam every backend implements: give it a reason there, and a second caller, before it is
    counted here."""
    tree = ast.parse((ROOT / "distlock" / "_protocol.py").read_text())
    (backend,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Backend"]
    members = [
        node.name if isinstance(node, ast.FunctionDef) else ast.unparse(node.target)
        for node in backend.body
        if isinstance(node, ast.AnnAssign | ast.FunctionDef)
    ]
    assert members == [
        "description",
        "unsupported",
        "check",
        "grant_lease",
        "keep_alive",
        "revoke_lease",
        "enqueue",
        "position",
        "wait",
        "dequeue",
        "head",
        "missing_tickets",
        "discard",
        "close",
        "after_fork",
    ]
    assert len(members) == 15


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
    """The checks above would see a violation: a cycle, a private import across packages, a TYPE_CHECKING import, a
    URL parser, a client's private name."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _private_crossing(Import("distlock_sqla._ops", "distlock._errors", ("ConfigurationError",), 1))
    assert _private_crossing(Import("distlock.celery._task", "distlock", ("_held",), 1))
    assert _private_crossing(Import("distlock.celery._task", "distlock._lock", ("Lock",), 1))
    assert not _private_crossing(Import("distlock.celery._task", "distlock", ("Lock",), 1))
    assert not _private_crossing(Import("distlock._lock", "distlock._fence", ("Fence",), 1))
    assert not _private_crossing(Import("benchmarks.redis_locks", "benchmarks._harness", ("Run",), 1))
    assert _url_parsing("m", "import urllib.parse\nurllib.parse.urlsplit(url)\n") == ["m:2: urlsplit"]
    assert _url_parsing("m", "from sqlalchemy.engine import make_url as parse\n") == ["m:1: make_url"]
    assert _url_parsing("m", "scheme = url.partition('://')[0]\n") == []
    assert _upward(Import("distlock.testing._plugin", "distlock_django", (), 1))
    assert not _upward(Import("distlock_django._pytest_plugin", "distlock", (), 1))
    assert _client_private_uses("m", "client._backend.head(name)\nself._context.keeper\n") == ["m:1: ._backend"]
    assert _client_private_uses("m", "self._client._context\n") == ["m:1: ._context", "m:1: ._client"]
    assert _client_private_uses("m", "from ._client import Client\n") == ["m:1: import of _client"]
    assert not _private_crossing(Import("benchmarks.redis_locks", "benchmarks._harness.run", ("Run",), 1))
    assert _harness_imports_a_benchmark(Import("benchmarks._harness.locks", "benchmarks.etcd_locks", ("Lock",), 1))
    assert _harness_imports_a_benchmark(Import("benchmarks._harness.locks", "benchmarks", ("etcd_locks",), 1))
    assert not _harness_imports_a_benchmark(Import("benchmarks._harness.timing", "benchmarks._harness.figures", (), 1))
    assert not _harness_imports_a_benchmark(Import("benchmarks.etcd_locks", "benchmarks._harness.run", ("Run",), 1))
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n")
    assert [ast.unparse(node) for node in _statements(tree)] == ["from typing import TYPE_CHECKING", "import b"]


def test_no_merge_conflict_is_left_in_any_file() -> None:
    """A conflict marker left by a merge (in a doc, which no test parses, it would go unnoticed)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    markers = ("<<<<<<< ", ">>>>>>> ", "=======\n")
    left = [
        f"{name}:{number}"
        for name in tracked
        if name.endswith((".py", ".md", ".toml", ".ini", ".sh", ".lua", ".yml", ".txt", ".html"))
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(keepends=True), 1)
        if line.startswith(markers[:2]) or line == markers[2]
    ]
    assert not left, "merge conflict markers left in:\n" + "\n".join(left)
