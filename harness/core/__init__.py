"""The vocabulary every layer shares: what a target is driven with and what is seen of it.

- ``ops``: the operations (manager calls and request changes); ``ops_json``: their JSON form;
- ``strict_json``: JSON read strictly (exact types, bounds, errors naming the JSON path), for
  operations and traces;
- ``book``: the request book, the scheduler-side state of every request, kept once for every target;
- ``observation``: what the harness sees of a target's state, in the spec's vocabulary;
- ``equality``: the named relations (``exact``, ``outcomes``, ``invariants``) and the differences
  they find between two outcomes or two observations;
- ``glimpse``: the part of a state one operation can change, read without walking the pool;
- ``flight``: the flight recorder, what a run was doing, written as it happens for a supervisor.

Nothing here knows a particular target, Hypothesis or the command line.

Imports: spec.
"""
