"""Makes ``scripts`` a package, so that ``python -m scripts.demo`` (what ``scripts/demo.sh`` runs) finds the demo.

The shell scripts beside it set up ``.venv`` (``bootstrap.sh``), the servers (``servers.sh``) and run the tests
(``test.sh``), the benchmarks (``bench.sh``) and the demo (``demo.sh``)."""
