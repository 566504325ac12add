"""What pre-allocation buys: a discrete-event simulation of a P/D cluster (``kvspec pd simulate``).

``inputs`` holds every assumption with its source and the measured manager-call costs,
``measure`` measures those costs on the real vLLM 0.33 ``KVCacheManager``, ``model`` is the
simulation (pull, sequential push, concurrent push and its variants), ``experiment`` holds the
workloads and summarises one run, ``goodput`` bisects each seed's goodput, ``analytic`` is the
closed-form estimate the simulation is checked against, ``stats`` turns seeds into intervals and
paired differences, ``report`` renders the tables and ``figures`` draws docs/figures/pd2-*.png.
"""
