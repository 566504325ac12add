"""kvspec's own implementation, in two parts that import nothing of each other or of ``spec/``:

- ``allocator``: a fast KV-cache block allocator with vLLM 0.33's manager semantics on flat arrays
  (block pool, one manager per attention kind, the manager; its events, requests and hashing);
- ``paged``: the torch side: a paged KV cache, a tiny seeded transformer, paged attention (torch
  and Triton) and the dense float64 reference the KV oracle compares against.

Imports: nothing.
"""
