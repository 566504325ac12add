"""``kvspec pd verify``: an exhaustive, explicit-state model check of the P/D protocols (issue 25).

``state``: the abstract cluster as a tuple (requests, reservations, messages, fault budgets) and
its symmetry (renaming requests and decode instances); ``model``: the transitions, the same
``Design`` decisions the fuzzed model of ``harness.pd`` makes, and the safety rules each
transition is judged by; ``designs``: vLLM's real push and pull baselines and the bugs of the
new fault kinds; ``search``: breadth-first search, the liveness check, the shortest
counterexample; ``cli``: the command.
"""
