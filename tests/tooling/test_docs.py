"""The documentation: the site builds with no warning, and no link in README, CONTRIBUTING or docs/ points at nothing.

``mkdocs build --strict`` (mkdocs.yml) fails on any warning: a page missing from the nav, a link to a missing page
or to a heading a page does not have, a docstring mkdocstrings cannot render. README.md and CONTRIBUTING.md are not
part of the site, and GitHub renders them and docs/*.md on their own, so every relative link there is checked here
too: its file must exist, and its ``#anchor`` must be a heading of the target as both GitHub and mkdocs spell
heading ids.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

import pytest

from distlock._install import DOCS_SITE

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def _prose(text: str) -> str:
    """Markdown without fenced code blocks, where neither links nor headings count."""
    return _FENCE.sub("", text)


def _heading_text(heading: str) -> str:
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return heading.replace("`", "").replace("*", "")


def _github_slug(heading: str) -> str:
    text = _heading_text(heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _mkdocs_slug(heading: str) -> str:
    # Python-Markdown's toc slugify, which mkdocs uses by default.
    text = unicodedata.normalize("NFKD", _heading_text(heading)).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """The heading ids of a Markdown file that GitHub and mkdocs both give (a link must work on both)."""
    headings = _HEADING.findall(_prose(path.read_text(encoding="utf-8")))
    return {_github_slug(h) for h in headings} & {_mkdocs_slug(h) for h in headings}


def relative_links(path: Path) -> list[str]:
    """The link and image targets of a Markdown file that are not URLs (outside code)."""
    text = _CODE_SPAN.sub("", _prose(path.read_text(encoding="utf-8")))
    return [target for target in _LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{target}: an absolute path (use one relative to {path.name})")
            continue
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: {resolved.name} has no heading with the id {anchor!r}")
    return problems


def markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_points_at_an_existing_file_and_heading(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## The `fence` and claim-on-read\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#the-fence-and-claim-on-read) [self](#page) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [no heading](other.md#nope)\n\n```\n[in code](ignored.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nope: other.md has no heading with the id 'nope'",
    ]


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "distlock" / "index.html").exists()


#: A repository path cited in prose: ``tests/…/x.py``, ``distlock/…/x.py`` (no link for mkdocs to check); not the
#: tail of a URL's path (``https://github.com/distlock/…``).
_CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:tests|distlock|distlock_django|distlock_sqla|benchmarks|faults|scripts)/[\w./-]*\.(?:py|sh|lua|md))(?![\w*])"
)


def test_every_file_the_docs_and_docstrings_cite_exists() -> None:
    """Files move (tests/ was laid out by shape): a path named in a doc, a module docstring or a comment must still
    name a file or folder of the repository."""
    sources = [
        *DOCS.rglob("*.md"),
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "tox.ini",
        REPO / "pyproject.toml",
    ]
    for package in ("distlock", "distlock_django", "distlock_sqla", "benchmarks", "faults", "tests", "scripts"):
        sources += [*(REPO / package).rglob("*.py"), *(REPO / package).rglob("*.sh")]
    missing = sorted(
        f"{source.relative_to(REPO)}: {cited}"
        for source in sources
        for cited in set(_CITED_PATH.findall(source.read_text()))
        if not (REPO / cited).exists()
    )
    assert not missing, "paths cited that do not exist:\n" + "\n".join(missing)


def _docs_url_pages() -> list[tuple[str, str]]:
    """Each ``docs_url(page)`` of the library (``page`` a string, or a module-level name bound to one), and where."""
    pages = []
    for package in ("distlock", "distlock_django", "distlock_sqla"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            constants = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "docs_url" and node.args:
                    arg = node.args[0]
                    page = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
                    pages.append((str(page), f"{path.relative_to(REPO)}:{node.lineno}"))
    return pages


def test_every_page_the_code_links_to_exists_on_the_one_documentation_site() -> None:
    """Messages link to the site (a pip user has no docs/): each page and heading they name must exist, and the site's
    address is the same in the code, pyproject.toml's [project.urls] and mkdocs.yml."""
    pages = _docs_url_pages()
    assert len(pages) >= 3, pages  # the Django settings' hints and the two "Upgrading" messages at least
    for page, where in pages:
        file_part, _, anchor = page.partition("#")
        assert (DOCS / file_part).is_file(), f"{where}: docs_url({page!r}) names no page of docs/"
        assert not anchor or anchor in anchors(DOCS / file_part), f"{where}: {file_part} has no heading {anchor!r}"
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == DOCS_SITE
    assert f"\nsite_url: {DOCS_SITE}\n" in (REPO / "mkdocs.yml").read_text()


#: A CamelCase name in a code span of the prose: ``DistributedLockMiddleware``, ``distlock.LockLost``.
_CAMEL_CASE = re.compile(r"(?<!\w)([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)\b")
_DEFINED = re.compile(r"^\s*(?:class|def)\s+(\w+)|^\s*(\w+)\s*[:=]", re.MULTILINE)
#: CamelCase names of other projects the docs mention (Django, SQLAlchemy, Celery, OpenTelemetry, etcd, ZooKeeper,
#: Python, Linux): only these may be named without being defined in distlock's packages.
OTHER_PROJECTS_NAMES = {
    *("AppConfig", "BigIntegerField", "CommonMiddleware", "HttpRequest", "LogEntry", "QuerySet", "MyQuerySet"),
    *("BaseDatabaseCreation", "ModelAdmin", "SecurityMiddleware", "TestCase", "TransactionTestCase"),
    *("AsyncConnection", "AsyncSession", "IntegrityError", "OperationalError", "StaleDataError"),
    *("ImmediateBackend", "TaskContext", "TaskResult"),  # django.tasks
    *(
        "AsyncResult",
        "EagerResult",
        "MeterProvider",
        "DeleteRange",
        "LeaseTimeToLive",
        "BadVersion",
        "NoNode",
        "NodeExists",
    ),
    *("NotEmpty", "ImportError", "ModuleNotFoundError", "TypeError", "VmRSS"),
    *("BaseException", "CancelledError", "TaskGroup"),
}


def test_every_class_name_the_docs_mention_exists() -> None:
    """A class renamed in the code and not in the prose (``DistlockMiddleware`` for ``DistributedLockMiddleware``) is
    found: every CamelCase name in a code span of README.md, CONTRIBUTING.md and docs/ is defined in distlock,
    distlock_django or distlock_sqla, is Python's own (a builtin), or is another project's
    (:data:`OTHER_PROJECTS_NAMES`)."""
    defined = {
        first or second
        for package in ("distlock", "distlock_django", "distlock_sqla")
        for module in (REPO / package).rglob("*.py")
        for first, second in _DEFINED.findall(module.read_text())
    }
    unknown = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for path in markdown_files()
        for code in _CODE_SPAN.findall(_FENCE.sub("", path.read_text()))
        for name in _CAMEL_CASE.findall(code)
        if name not in defined and name not in OTHER_PROJECTS_NAMES and not hasattr(builtins, name)
    )
    assert not unknown, "names the code does not define (another project's? add it to OTHER_PROJECTS_NAMES):\n" + (
        "\n".join(unknown)
    )


def test_the_metrics_page_names_every_value_of_the_backend_attribute() -> None:
    from distlock.backends import SCHEMES

    page = (DOCS / "operations" / "metrics.md").read_text()
    (line,) = [line for line in page.splitlines() if line.startswith("- `distlock.backend`:")]
    assert {f"`{scheme.backend}`" for scheme in SCHEMES.values()} <= set(_CODE_SPAN.findall(line)), line
