"""kvspec's harness: differential fuzzing of the spec against real KV-cache managers, reports, CLI.

Folders by area, each importing only the ones listed in its own docstring's ``Imports:`` line
(``tests/test_layout.py`` checks it), from the bottom up:

- ``core``: operations, the request book, observations, glimpses, equality relations;
- ``world``: families, kvspec's scheduler model and the one workload;
- ``targets``: one adapter per manager (spec, vLLM, impl, a user's) and the forms of their answers;
- ``ledger``: the KV ledger (which KV each slot holds) and the known bugs;
- ``oracle``: the torch KV-content oracle;
- ``mutants``: deliberate bugs, the catalogues kvspec must catch;
- ``check``: lockstep (spec and target stepped together and checked) and the state machine;
- ``traces``: trace files, replay, reduction and reports;
- ``run``: the fuzzing loop, its options, workers, signals, profiles, JUnit, the pytest plugin;
- ``vllm_sched``, ``pd``, ``proofs``, ``bench``: vLLM's real scheduler as a target, the P/D
  protocols, the Z3 proofs, the benchmarks;
- ``cli`` (``kvspec``) and ``campaign`` (``kvspec mutants``) on top.

docs/architecture.md walks the spine (cli -> run -> check -> targets -> spec) and says where to
add a target, an invariant, a family and a mutant.
"""

__version__ = "0.1.0"
