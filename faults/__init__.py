"""A Jepsen-style fault matrix for distlock: a nemesis, lock services, a workload, a checker and a runner
(``python -m faults``).

Not installed with the library: run it from a checkout, as root for the partition faults.

- ``_service``: the lock service under test as one interface (`Service`: start and close, the distlock URL, the
  faults it supports by name, do one, undo it); ``_etcd``: a 3-member etcd cluster (member kills and pauses,
  nftables partitions, compaction storms, a whole-cluster restart); ``_servers``: one Redis server (a restart that
  forgets every lock, SIGSTOP), one ZooKeeper server and the PostgreSQL lock table (SIGKILL and start again, SIGSTOP
  past the TTL).
- ``_nemesis``: runs a fault on a service, as a `Window`, and does the faults on lock-holding worker processes
  (``holder-pause``, on every service: a holder frozen between read and write past its TTL), each undone after.
- ``_workload``: worker processes doing lock -> claim -> read -> write -> release on one row, through the raw API,
  ``distlock_sqla`` or ``distlock_django``, on SQLite or PostgreSQL, recording every operation.
- ``_checker``: lost updates, token order and duplicates from the final database state; availability from the
  history.
- ``_runner``: ``--short`` (CI, tests/tooling/test_fault_matrix.py) and ``--long`` (writes docs/VERIFICATION.md, a
  section per lock service: per etcd version given with ``--etcd-bin``, Redis, ZooKeeper, the lock table).
"""

from faults._checker import Result, check
from faults._nemesis import Nemesis, Window
from faults._runner import SERVICES, Case, Options, Outcome, estimate, long_cases, main, run_matrix, short_cases
from faults._service import Service
from faults._workload import Config, Op

__all__ = [
    "SERVICES",
    "Case",
    "Config",
    "Nemesis",
    "Op",
    "Options",
    "Outcome",
    "Result",
    "Service",
    "Window",
    "check",
    "estimate",
    "long_cases",
    "main",
    "run_matrix",
    "short_cases",
]
