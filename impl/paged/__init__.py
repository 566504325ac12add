"""The torch side of kvspec's implementation: what the KV-content oracle (``harness.oracle``) runs.

- ``kv_cache``: a paged KV store, one ``[num_blocks, block_size, kv_heads, head_dim]`` cache per
  layer, poisoned with NaN until written (and again when its blocks are freed);
- ``attention``: paged attention through block tables (torch, and a Triton kernel on CUDA) and the
  dense float64 reference;
- ``model``: a tiny seeded transformer whose layers write and read that cache.

Code takes a ``device`` and runs on CUDA when present.

Imports: nothing.
"""
