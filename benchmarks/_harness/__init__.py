"""The machinery the benchmarks share, one module per concern; a benchmark imports from the module it uses.

* :mod:`~benchmarks._harness.run`: a run's command line and start (:class:`Run`), the options benchmarks share.
* :mod:`~benchmarks._harness.machine`: the lines on the machine a section states (CPU, software, distlock's commit).
* :mod:`~benchmarks._harness.servers`: the lock service under test with its request counters; etcd, PostgreSQL.
* :mod:`~benchmarks._harness.figures`: statistics (nearest-rank percentiles, ratios) and how figures are written.
* :mod:`~benchmarks._harness.report`: a benchmark's section of ``docs/BENCHMARKS.md``, printed and written.
* :mod:`~benchmarks._harness.timing`: variants timed in turns in one process, and their table.
* :mod:`~benchmarks._harness.locks`: the locks a lock benchmark measures, as sessions, and its plan.
* :mod:`~benchmarks._harness.results`: what a lock benchmark measured, its figures and tables.
* :mod:`~benchmarks._harness.processes`: a lock benchmark's measurements in spawned processes, start to end.

Each module imports only modules listed above it (``machine`` names ``ServerUnderTest`` for its types alone), and
never a benchmark; names without a leading underscore are public to the benchmarks (tests/tooling/test_architecture.py
checks the import graph and the names). This package exports nothing of its own.
"""

__all__: list[str] = []
