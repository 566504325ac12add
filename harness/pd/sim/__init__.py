"""What pre-allocation buys: a discrete-event simulation of a P/D cluster (``kvspec pd simulate``).

``inputs`` holds every assumption with its source and the measured manager-call costs,
``measure`` measures those costs on the real vLLM 0.33 ``KVCacheManager``, ``model`` is the
simulation, ``experiment`` sweeps the load and ``figures`` draws docs/figures/pd-*.png.
"""
