"""``python -m kvspec.harness.bench``: the benchmarks' command line (``harness.bench.allocator``)."""

from kvspec.harness.bench.allocator import main

main()
