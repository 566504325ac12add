"""vLLM's releases as forks of one reading (consensus-specs style).

The spec models vLLM 0.33.0 (the base reading).  Every other supported release, 0.23.0 to 0.34.0,
is a ``Profile``: the base reading with the named ``Change``s that separate that release from
0.33.0, each change a knob the spec consults, with the release and vLLM function it models.
- ``profile.py``: ``Profile`` (the knobs, 0.33.0 values by default) and ``Change``;
- ``v0_24.py`` ... ``v0_34.py``: one module per release, listing only what that release changed;
- ``line.py``: ``RELEASES`` in order, ``profile_for(version)``, ``changes_between(old, new)`` and the
  error for a release kvspec does not know (naming the nearest ones).

Imports: spec.
"""
