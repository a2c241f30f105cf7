"""A Jepsen-style fault matrix for distlock: a nemesis, a workload, a checker and a runner (``python -m faults``).

Not installed with the library: run it from a checkout, as root for the partition faults.

- ``_nemesis``: faults on a 3-member etcd cluster, on one Redis server (a restart that forgets every lock, SIGSTOP)
  and on lock-holding worker processes (kills, SIGSTOP, nftables partitions, compaction storms, restarts), each
  undone when it ends.
- ``_workload``: worker processes doing lock -> claim -> read -> write -> release on one row, through the raw API,
  ``distlock_sqla`` or ``distlock_django``, on SQLite or PostgreSQL, recording every operation.
- ``_checker``: lost updates, token order and duplicates from the final database state; availability from the
  history.
- ``_runner``: ``--short`` (CI, tests/tooling/test_fault_matrix.py) and ``--long`` (writes docs/VERIFICATION.md, a
  section per etcd version given with ``--etcd-bin`` and one for Redis).
"""

from faults._checker import Result, check
from faults._nemesis import FAULTS, REDIS_FAULTS, Nemesis, Window
from faults._runner import Case, Options, Outcome, estimate, long_cases, main, run_matrix, short_cases
from faults._workload import Config, Op

__all__ = [
    "FAULTS",
    "REDIS_FAULTS",
    "Case",
    "Config",
    "Nemesis",
    "Op",
    "Options",
    "Outcome",
    "Result",
    "Window",
    "check",
    "estimate",
    "long_cases",
    "main",
    "run_matrix",
    "short_cases",
]
