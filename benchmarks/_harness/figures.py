"""Statistics and how a figure is written: percentiles, ratios, requests per acquisition, table cells.

Percentiles are nearest-rank over the samples in any order; a figure that cannot be computed (no samples, a zero
denominator) is :data:`NA` in a table, never an exception: a benchmark with a failed variant still prints the others.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = [
    "NA",
    "breakdown",
    "latency_cells",
    "median",
    "ms",
    "per",
    "percentile",
    "ratio",
    "table_row",
    "target",
    "verdict",
]

#: A figure that cannot be computed (no samples, a zero denominator).
NA = "n/a"


def percentile(samples: Iterable[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (in any order); nan if there are none."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else math.nan


def median(samples: Iterable[float]) -> float:
    return percentile(samples, 50)


def ms(seconds: float) -> str:
    return NA if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def per(count: float, acquisitions: int) -> float:
    return count / acquisitions if acquisitions else math.nan


def ratio(numerator: float, denominator: float) -> str:
    value = numerator / denominator if denominator else math.nan
    return NA if math.isnan(value) else f"{value:.2f}x"


def breakdown(requests: Counter[str], acquisitions: int) -> str:
    """Requests by kind (RPC method, command) per acquisition, most first, leaving out the negligible."""
    per_kind = [(kind, per(count, acquisitions)) for kind, count in requests.most_common()]
    return ", ".join(f"{kind} {share:.2f}" for kind, share in per_kind if share >= 0.005) or NA


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def target(value: float, bound: float) -> str:
    """`` (target ≤ 1.15x: met)``: whether the ratio ``value`` stays within ``bound``."""
    return f" (target ≤ {bound:.2f}x: {verdict(value <= bound)})"


def table_row(cells: Iterable[str]) -> str:
    return f"| {' | '.join(cells)} |"


def latency_cells(label: str, seconds: Sequence[float]) -> list[str]:
    """A table row's label, rounds, median ms and p99 ms."""
    return [label, str(len(seconds)), ms(percentile(seconds, 50)), ms(percentile(seconds, 99))]
