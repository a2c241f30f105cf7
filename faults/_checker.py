"""The checker: what a run's history and the database's final state say about safety and availability.

Safety, from the final state (the counter row and the ``faults_writes`` audit table, whose order is commit order):

- **lost**: committed writes missing from the final state. A counter must equal the number of committed writes
  (audit rows); a lock-set list must hold every committed token. A lost update shows here.
- **acknowledged missing**: writes a worker saw commit (``ok``) with no audit row (it is in the write's transaction).
- **token decreases**: audit rows whose token is below the row before them: a stale holder wrote after a newer one.
- **duplicate tokens**: tokens with more than one committed write (two writes under one lock hold).

A write the worker could not classify (``unknown``: an error during its commit) may be in the audit or not; both are
fine, and the counter is checked against the audit, not against the acknowledgements.

Availability, from the history: the longest time between successive grants of the lock, over the whole run and
around each fault window (from the last grant before it to the first grant after it). Workers record grants on
CLOCK_MONOTONIC, like the nemesis's windows. What can go wrong: a run too short to see a grant after a window
measures the gap up to the window's end only.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from faults._nemesis import Window
from faults._workload import Op

__all__ = ["REFUSALS", "Audit", "Result", "check"]

#: Error types by which the database refused a stale claim or write.
REFUSALS = frozenset({"Refused", "StaleFenceToken", "StaleDataError"})


@dataclass(frozen=True)
class Audit:
    """One committed write: its position in commit order, token, worker, and what it wrote."""

    seq: int
    token: int
    worker: int
    value: str


@dataclass
class Result:
    """The measures of one run; ``str()`` gives one line per measure."""

    operations: int
    acknowledged: int
    unknown: int
    refused: int
    failed: int
    lost: int
    missing: int
    token_decreases: int
    duplicate_tokens: int
    longest_gap: float
    gaps: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        return self.lost + self.missing + self.token_decreases + self.duplicate_tokens

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def __str__(self) -> str:
        lines = [
            f"operations            {self.operations}",
            f"acknowledged          {self.acknowledged}",
            f"unknown outcome       {self.unknown}",
            f"stale writes refused  {self.refused}",
            f"other failures        {self.failed}",
            f"lost updates          {self.lost}",
            f"acknowledged missing  {self.missing}",
            f"token decreases       {self.token_decreases}",
            f"duplicate tokens      {self.duplicate_tokens}",
            f"longest gap (run)     {self.longest_gap:.2f} s",
            *(f"longest gap ({fault}) {gap:.2f} s" for fault, gap in self.gaps.items()),
            f"errors                {dict(sorted(self.errors.items())) or 'none'}",
            f"verdict               {'ok' if self.ok else f'{self.violations} violation(s)'}",
        ]
        return "\n".join(lines)


def _longest_gap(points: Sequence[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def _window_gap(grants: Sequence[float], window: Window) -> float:
    before = [g for g in grants if g < window.start]
    inside = [g for g in grants if window.start <= g <= window.end]
    after = [g for g in grants if g > window.end]
    points = [before[-1] if before else window.start, *inside, after[0] if after else window.end]
    return _longest_gap(points)


def check(
    history: Sequence[Op],
    audit: Sequence[Audit],
    final_value: int,
    final_items: str,
    windows: Sequence[Window] = (),
    kind: str = "counter",
) -> Result:
    """Judge one run: ``history`` from every worker, ``audit`` in commit order, the row's final value and items."""
    acked = [op for op in history if op.outcome == "ok"]
    audited = {(row.worker, row.token) for row in audit}
    missing = sum((op.worker, op.token) not in audited for op in acked)
    if kind == "set":
        in_list = Counter(int(item) for item in final_items.split(",") if item)
        lost = sum(row.token not in in_list for row in audit)
    else:
        lost = max(0, len(audit) - final_value)
    ordered = sorted(audit, key=lambda row: row.seq)
    decreases = sum(b.token < a.token for a, b in itertools.pairwise(ordered))
    duplicates = sum(count - 1 for count in Counter(row.token for row in audit).values() if count > 1)
    grants = sorted(op.granted for op in history if op.granted is not None)
    gaps: dict[str, float] = {}
    for number, window in enumerate(windows, 1):
        key = f"{window.fault} #{number}"
        gaps[key] = _window_gap(grants, window)
    failures = [op for op in history if op.outcome == "fail"]
    return Result(
        operations=len(history),
        acknowledged=len(acked),
        unknown=sum(op.outcome == "unknown" for op in history),
        refused=sum(op.error in REFUSALS for op in failures),
        failed=sum(op.error not in REFUSALS for op in failures),
        lost=lost,
        missing=missing,
        token_decreases=decreases,
        duplicate_tokens=duplicates,
        longest_gap=_longest_gap(grants),
        gaps=gaps,
        errors=dict(Counter(op.error for op in history if op.error is not None)),
    )
