"""kvspec: an executable reference model of vLLM's v1 KV-cache manager, and the tools to hold real
managers to it.  Everything is imported under this one name:

- ``kvspec.spec``: the reference model (the folder ``spec/``);
- ``kvspec.impl``: kvspec's own allocator and the torch paged KV cache and model (``impl/``);
- ``kvspec.harness``: differential testing, the CLI (``kvspec``) and the pytest plugin (``harness/``).

The three folders stay at the top of the repository; this package links them (``kvspec/spec`` ->
``../spec`` and so on), so the source tree, an editable install and the wheel all import them as
``kvspec.*`` and nothing else is installed beside it.
"""

__version__ = "0.1.0"
