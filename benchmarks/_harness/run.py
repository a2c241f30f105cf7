"""A benchmark run and its command line: :class:`Run`, and the options the benchmarks share.

:class:`Run` keeps what a section states first: the command, when it started, the machine's load then (the figures
are only as quiet as the machine), and an id that tells this run's lock names and keys from any other run's on the
same server. The options: those of the lock benchmarks (:func:`add_lock_arguments`, checked by
:func:`parse_lock_arguments`), of the database benchmarks (:func:`database_arguments`), a subset of a benchmark's
choices (:func:`add_subset_argument`, :func:`check_subset`), and ``--etcd-url`` / ``--out`` (:func:`add_etcd_arguments`,
:func:`add_out_argument`); :func:`summary` is a benchmark's ``--help`` description.

What can go wrong: a bad option value (no rounds, a negative duration, an unknown lock) stops the run through
``argparse``'s own error, before any server starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "Run",
    "add_etcd_arguments",
    "add_lock_arguments",
    "add_out_argument",
    "add_subset_argument",
    "check_subset",
    "database_arguments",
    "parse_lock_arguments",
    "summary",
]


@dataclasses.dataclass(frozen=True)
class Run:
    """A benchmark run's command line, start time and the machine's load then: what its section states first.
    ``id`` tells this run's lock names, keys and queues from any other run's on the same server."""

    module: str
    argv: list[str]
    command: str
    started: dt.datetime
    clock: float
    load: float
    id: str

    @classmethod
    def begin(cls, module: str, argv: Sequence[str] | None) -> Run:
        """Start the clock for ``python -m module`` with ``argv`` (None: this process's arguments)."""
        load = os.getloadavg()[0]  # before our own processes add to it
        args = sys.argv[1:] if argv is None else list(argv)
        command = shlex.join(["python", "-m", module, *args])
        return cls(module, args, command, dt.datetime.now(dt.UTC), time.monotonic(), load, uuid.uuid4().hex[:8])

    @property
    def prog(self) -> str:
        """The command's name in ``--help``."""
        return f"python -m {self.module}"

    def when(self, note: str = "") -> str:
        """The command, when it started and how long it took (until now)."""
        elapsed = time.monotonic() - self.clock
        return f"`{self.command}`{note}, {self.started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s in all."

    def load_line(self) -> str:
        return f"- Load average (1 min) when the run started: {self.load:.1f} (other work on the machine adds noise)"

    def heading(self, title: str, machine: Iterable[str], note: str = "") -> list[str]:
        """A section's first lines: its title, the command (with ``note``) and when it ran, the machine, the load."""
        return [title, "", self.when(note), "", *machine, self.load_line(), ""]


def summary(doc: str | None) -> str:
    """The first paragraph of a module's docstring: a benchmark's ``--help`` description."""
    return (doc or "").split("\n\n")[0]


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"), help="file to update")


def add_etcd_arguments(parser: argparse.ArgumentParser, *, metrics_help: bool = True) -> None:
    """``--etcd-url`` and ``--metrics-url`` (the latter hidden from ``--help`` unless ``metrics_help``)."""
    parser.add_argument("--etcd-url", help="use this etcd (etcd://HOST:PORT) instead of starting one")
    shown = "its Prometheus metrics (default http://HOST:PORT/metrics)"
    parser.add_argument("--metrics-url", help=shown if metrics_help else argparse.SUPPRESS)


def add_lock_arguments(parser: argparse.ArgumentParser, labels: Sequence[str], *, rounds: int, warmup: int) -> None:
    """The options every lock benchmark takes: rounds, warm-up, duration, process counts, locks, output file."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"uncontended rounds per lock (default {rounds})")
    parser.add_argument("--warmup", type=int, default=warmup, help=f"uncontended warm-up rounds (default {warmup})")
    parser.add_argument("--duration", type=float, default=10.0, help="contention run length, s (default 10)")
    parser.add_argument(
        "--processes",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[8, 32],
        help="comma-separated process counts for contention (default 8,32)",
    )
    add_subset_argument(parser, "--locks", labels)
    add_out_argument(parser)


def add_subset_argument(parser: argparse.ArgumentParser, option: str, choices: Sequence[str]) -> None:
    """``option``: a comma-separated subset of ``choices`` (default all), checked by :func:`check_subset`."""
    parser.add_argument(
        option,
        type=lambda s: s.split(","),
        default=list(choices),
        help=f"comma-separated subset of {','.join(choices)} (default all)",
    )


def check_subset(parser: argparse.ArgumentParser, chosen: Iterable[str], choices: Sequence[str], what: str) -> None:
    """Stop the run through ``argparse`` if ``chosen`` names any ``what`` (lock, service) outside ``choices``."""
    unknown = set(chosen) - set(choices)
    if unknown:
        parser.error(f"unknown {what}(s) {', '.join(sorted(unknown))}; choose from {', '.join(choices)}")


def parse_lock_arguments(parser: argparse.ArgumentParser, run: Run, labels: Sequence[str]) -> argparse.Namespace:
    """Parse the run's arguments and check what :func:`add_lock_arguments` added."""
    args = parser.parse_args(run.argv)
    check_subset(parser, args.locks, labels, "lock")
    if args.rounds < 1 or args.duration <= 0 or not all(n > 0 for n in args.processes):
        parser.error("--rounds, --duration and --processes must be positive")
    return args


def database_arguments(run: Run, description: str) -> argparse.Namespace:
    """Parse the options of a database benchmark (:mod:`benchmarks.sqla_fenced`, :mod:`benchmarks.django_overhead`)."""
    parser = argparse.ArgumentParser(run.prog, description=description)
    parser.add_argument("--rounds", type=int, default=2000, help="rounds per variant and database (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up rounds per variant (default 200)")
    parser.add_argument("--block", type=int, default=25, help="rounds per interleaved block (default 25)")
    parser.add_argument("--fsync", action="store_true", help="start PostgreSQL with fsync on (default off)")
    parser.add_argument("--postgres-url", help="use this PostgreSQL (postgresql://...) instead of starting one")
    add_etcd_arguments(parser, metrics_help=False)
    add_out_argument(parser)
    args = parser.parse_args(run.argv)
    if args.rounds < 1 or args.warmup < 0 or args.block < 1:
        parser.error("--rounds and --block must be positive, --warmup not negative")
    return args
