"""The benchmarks behind docs/BENCHMARKS.md: one module per comparison, all built on the parts of ``_harness``.

Run them with ``bash scripts/bench.sh`` (or one with ``python -m benchmarks.<module>``); each starts its own throwaway
servers and writes its section of docs/BENCHMARKS.md. Nothing here is imported by the library."""
