"""``python -m harness.bench``: the benchmarks' command line (``harness.bench.allocator``)."""

from harness.bench.allocator import main

main()
