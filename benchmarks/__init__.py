"""Speed benchmarks and the generators they use (not tests: run by hand, from the repository root,
as ``python -m benchmarks.NAME``). ``tests/benchmarks`` holds the pytest-benchmark ones (``make bench``)."""
