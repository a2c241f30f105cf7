"""What a lock benchmark measured, and the tables and ratios its section is made of.

:class:`WorkerResult` is what one process reports, :class:`Outcome` what one measurement (one or N processes)
gathered; :class:`Uncontended` and :class:`Contended` compute their figures: latencies, requests per acquisition,
acquisitions per second, fairness (fewest ÷ most acquisitions of one process), and whether the lock excluded (a
counter that no other lock guards equals the acquisitions, and no process saw another inside).
:class:`LockResults` holds a whole run and writes its comparisons (distlock against the floor, against a peer).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from benchmarks._harness.figures import NA, breakdown, ms, per, percentile, ratio, table_row, target, verdict

__all__ = [
    "Contended",
    "LockResults",
    "Outcome",
    "Uncontended",
    "WorkerResult",
    "contended_table",
    "uncontended_table",
]


@dataclasses.dataclass
class WorkerResult:
    index: int
    lock: str
    # Uncontended: seconds per acquire + release. Contention: seconds waited per acquisition in the window.
    seconds: list[float] = dataclasses.field(default_factory=list)
    requests: Counter[str] = dataclasses.field(default_factory=Counter)  # uncontended: counted by the child
    late: int = 0  # contention: acquisitions after the window closed (waiters draining), not counted
    failures: int = 0  # contention: acquire() returned False
    overlaps: int = 0  # contention: another process was inside the critical section at the same time
    error: str | None = None


@dataclasses.dataclass
class Outcome:
    results: list[WorkerResult]
    requests: Counter[str]
    leftovers: int
    errors: list[str]

    @property
    def samples(self) -> list[float]:
        return sorted(s for r in self.results for s in r.seconds)


@dataclasses.dataclass
class Uncontended:
    result: WorkerResult

    @property
    def samples(self) -> list[float]:
        return sorted(self.result.seconds)

    @property
    def median(self) -> float:
        return percentile(self.samples, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 99)

    @property
    def requests_per_acquisition(self) -> float:
        return per(self.result.requests.total(), len(self.samples))

    def row(self, labels: Mapping[str, str]) -> str:
        """Label, rounds, median, p99 and max ms, requests per acquisition, and by kind."""
        samples = self.samples
        return table_row(
            [
                labels[self.result.lock],
                str(len(samples)),
                ms(self.median),
                ms(self.p99),
                ms(max(samples, default=math.nan)),
                f"{self.requests_per_acquisition:.2f}",
                breakdown(self.result.requests, len(samples)),
            ]
        )


def uncontended_table(labels: Mapping[str, str], rows: Iterable[Uncontended], requests: str, kind: str) -> list[str]:
    """The table of :meth:`Uncontended.row` s; ``requests`` names the server's requests ("RPCs"), ``kind`` what
    they are counted by ("method")."""
    return [
        f"| Lock | rounds | median ms | p99 ms | max ms | {requests} / acq. | {requests} by {kind} / acq. |",
        "|---|---:|---:|---:|---:|---:|---|",
        *(row.row(labels) for row in rows),
    ]


@dataclasses.dataclass
class Contended:
    lock: str
    processes: int
    duration: float
    counter: int
    outcome: Outcome

    @property
    def acquisitions(self) -> int:
        return len(self.outcome.samples)

    @property
    def rate(self) -> float:
        return self.acquisitions / self.duration

    @property
    def per_process(self) -> tuple[int, int]:
        """The fewest and the most acquisitions of one process in the window."""
        counts = [len(r.seconds) for r in self.outcome.results]
        return min(counts, default=0), max(counts, default=0)

    @property
    def requests_per_acquisition(self) -> float:
        return per(self.outcome.requests.total(), self.acquisitions)

    @property
    def fairness(self) -> float:
        low, high = self.per_process
        return low / high if high else math.nan

    @property
    def exclusion(self) -> str:
        """Did the lock exclude? The unguarded counter must equal the acquisitions, with no overlap seen."""
        results = self.outcome.results
        total = sum(len(r.seconds) + r.late for r in results)
        overlaps = sum(r.overlaps for r in results)
        if len(results) == self.processes and total == self.counter and overlaps == 0:
            return "ok"
        return f"**counter {self.counter} for {total} acquisitions, {overlaps} overlaps**"

    def row(self, labels: Mapping[str, str]) -> str:
        """Label, processes, acquisitions/s, requests per acquisition, wait p50 and p99 ms, acquisitions per
        process, fairness, failures, exclusion, requests by kind, leftovers."""
        results = self.outcome.results
        samples = self.outcome.samples
        low, high = self.per_process
        return table_row(
            [
                labels[self.lock],
                str(self.processes),
                f"{self.rate:.1f}",
                f"{self.requests_per_acquisition:.2f}",
                ms(percentile(samples, 50)),
                ms(percentile(samples, 99)),
                f"{low}..{high}",
                NA if math.isnan(self.fairness) else f"{self.fairness:.2f}",
                str(sum(r.failures for r in results)),
                self.exclusion,
                breakdown(self.outcome.requests, self.acquisitions),
                str(self.outcome.leftovers),
            ]
        )


def contended_table(
    labels: Mapping[str, str], rows: Iterable[Contended], requests: str, kind: str, leftovers: str
) -> list[str]:
    """The table of :meth:`Contended.row` s; ``requests`` and ``kind`` as in :func:`uncontended_table`,
    ``leftovers`` names what a measurement left on the server ("leases left")."""
    return [
        f"| Lock | processes | acq./s | {requests} / acq. | wait p50 ms | wait p99 ms | acq. per process | fairness "
        f"| failures | exclusion | {requests} by {kind} / acq. | {leftovers} |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|",
        *(row.row(labels) for row in rows),
    ]


@dataclasses.dataclass
class LockResults:
    """What :func:`measure` measured, and the errors it met."""

    uncontended: list[Uncontended]
    contended: list[Contended]
    errors: list[str]

    @property
    def uncontended_by_lock(self) -> dict[str, Uncontended]:
        return {u.result.lock: u for u in self.uncontended}

    def floor_lines(self, bound: float | None = None) -> list[str]:
        """distlock's uncontended median ÷ the floor's (the locks ``distlock`` and ``raw``), if both were measured;
        with ``bound``, whether it stays within it."""
        by_lock = self.uncontended_by_lock
        if "distlock" not in by_lock or "raw" not in by_lock:
            return []
        ours, floor = by_lock["distlock"].median, by_lock["raw"].median
        beside = "" if bound is None else target(ours / floor, bound)
        return [f"- Uncontended, distlock median ÷ raw floor median: {ratio(ours, floor)}{beside}"]

    def peer_lines(
        self, processes: Sequence[int], peer: str, label: str, target: tuple[float, float] | None = None
    ) -> list[str]:
        """distlock against the lock ``peer`` (called ``label`` in prose): the uncontended median and p99 ratios, then
        at each process count both measured the acquisitions/s ratio beside both fairnesses; with ``target`` (a
        rate ratio and a fairness), whether distlock met it."""
        by_lock = self.uncontended_by_lock
        lines = []
        if "distlock" in by_lock and peer in by_lock:
            ours, theirs = by_lock["distlock"], by_lock[peer]
            lines.append(
                f"- Uncontended, distlock ÷ {label}: median {ratio(ours.median, theirs.median)}, "
                f"p99 {ratio(ours.p99, theirs.p99)}"
            )
        by_run = {(c.lock, c.processes): c for c in self.contended}
        for n in processes:
            ours_c, theirs_c = by_run.get(("distlock", n)), by_run.get((peer, n))
            if ours_c is None or theirs_c is None:
                continue
            line = (
                f"- {n} processes: distlock acquisitions/s {ratio(ours_c.rate, theirs_c.rate)} of {label}'s, "
                f"fairness {ours_c.fairness:.2f} ({peer} {theirs_c.fairness:.2f})"
            )
            if target is not None:
                rate, fairness = target
                met = ours_c.rate >= rate * theirs_c.rate and ours_c.fairness >= fairness
                line += f" (target >= {rate:g}x with fairness >= {fairness:g}: {verdict(met)})"
            lines.append(line)
        return lines
