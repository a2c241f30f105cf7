"""A benchmark's section of ``docs/BENCHMARKS.md``: made (:func:`section`), printed and written (:func:`publish`).

Each benchmark owns the text between its own markers (``<!-- name:begin -->`` and ``<!-- name:end -->``); writing
replaces that text, or appends the section if its markers are missing, and leaves the rest of the file alone (the
prose around the sections is written by hand). :func:`errors_lines` puts a run's errors under their own heading, so
a run that met errors says so in the file, not only on the terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["errors_lines", "publish", "section"]


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(name: str, lines: Iterable[str]) -> str:
    """The benchmark ``name``'s section of ``docs/BENCHMARKS.md``: ``lines`` between its markers."""
    begin, end = _markers(name)
    return "\n".join([begin, *lines, end]) + "\n"


def _write_section(path: Path, name: str, text: str) -> None:
    """Replace the benchmark ``name``'s section of ``path`` with ``text`` (or append it), keeping every other."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    begin_marker, end_marker = _markers(name)
    begin, end = old.find(begin_marker), old.find(end_marker)
    if begin != -1 and end > begin:
        rest = old[end + len(end_marker) :].lstrip("\n")
        new = old[:begin] + text + ("\n" + rest if rest else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def errors_lines(errors: Sequence[str]) -> list[str]:
    """The errors of a run, under their own heading; nothing if there were none."""
    return ["", "### Errors", "", *(f"- {e}" for e in errors)] if errors else []


def publish(path: Path, name: str, text: str) -> None:
    """Print the benchmark ``name``'s section ``text`` (made by :func:`section`) and write it into ``path``."""
    _write_section(path, name, text)
    print(text, flush=True)
    print(f"written to {path}", flush=True)
