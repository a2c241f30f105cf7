"""Measuring in one process: several variants timed in turns (:func:`interleaved`), and their table.

:func:`interleaved` times each variant in blocks whose order rotates from block to block, so a slow spell of a shared
machine hits them alike; with a server's :class:`~benchmarks._harness.servers.Counters`, the requests of each block
are credited to its variant. :class:`Variants` keeps one set-up's timings (one database's, say) and writes its rows,
each against a base variant (:func:`variants_table`). A variant that raises stops the measurement: the exception is
the caller's.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from benchmarks._harness.figures import latency_cells, median, ratio, table_row
from benchmarks._harness.servers import Counters

__all__ = ["Timed", "Variants", "interleaved", "variants_table"]


@dataclasses.dataclass
class Timed:
    """What :func:`interleaved` measured of one variant: seconds per call, and requests if a server was counted."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    requests: Counter[str] = dataclasses.field(default_factory=Counter)


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int,
    block: int,
    counters: Counters | None = None,
) -> dict[str, Timed]:
    """The seconds of ``rounds`` calls of each of ``runs``, after ``warmup`` calls of each: interleaved blocks of
    ``block`` calls per run, the order rotating from block to block, so a slow spell hits them alike. With
    ``counters``, the server's requests are read before and after each block and credited to its run."""
    keys = list(runs)
    for key in keys:
        for _ in range(warmup):
            runs[key]()
    timed = {key: Timed() for key in keys}
    clock = time.perf_counter
    for k, done in enumerate(range(0, rounds, block)):
        shift = k % len(keys)
        for key in keys[shift:] + keys[:shift]:
            run, samples = runs[key], timed[key].seconds
            before = counters.requests() if counters is not None else Counter()
            for _ in range(min(block, rounds - done)):
                t0 = clock()
                run()
                samples.append(clock() - t0)
            if counters is not None:
                timed[key].requests += counters.requests() - before
    return timed


@dataclasses.dataclass
class Variants:
    """The :func:`interleaved` timings of one set-up's variants (one database's, say), and what that set-up is."""

    label: str
    description: str
    timed: dict[str, Timed] = dataclasses.field(default_factory=dict)

    def median(self, variant: str) -> float:
        return median(self.timed[variant].seconds)

    def row(self, variant: str, label: str, base: str) -> str:
        """A row of :func:`variants_table`: the variant's figures and its median ÷ the ``base`` variant's."""
        cells = latency_cells(label, self.timed[variant].seconds)
        return table_row([self.label, *cells, ratio(self.median(variant), self.median(base))])


def variants_table(rows: Iterable[str]) -> list[str]:
    """A table of :meth:`Variants.row` s, one set-up (a database) after another."""
    return [
        "| Database | variant | rounds | median ms | p99 ms | median ÷ plain |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
    ]
