"""The KV ledger: which KV each slot holds, checked on any target's observed block tables.

- ``schedule``: the one mapping from operations to what the model runner does with KV (shared with
  the torch oracle, ``harness.oracle``); ``request``: what that mapping knows of a request;
- ``checker``: ``LedgerChecker``, ``spec.kv_ledger`` fed from a target's tables after every step;
- ``finding``: what a broken ledger rule reports, with a stable, matchable signature;
- ``known_bugs``: known bugs of the targets as data, recognised by their ledger signature.

Imports: harness.core, harness.targets, spec.
"""
