"""Every claim of ``kvspec prove``, in report order."""

from __future__ import annotations

from kvspec.harness.proofs.core import Claim


def all_claims() -> list[Claim]:
    import kvspec.harness.proofs.allocation as allocation
    import kvspec.harness.proofs.coverage as coverage
    import kvspec.harness.proofs.coverage_failures as coverage_failures
    import kvspec.harness.proofs.hybrid as hybrid
    import kvspec.harness.proofs.keys as keys
    import kvspec.harness.proofs.pool as pool
    import kvspec.harness.proofs.windows as windows

    return [
        *allocation.CLAIMS,
        *windows.CLAIMS,
        *coverage.CLAIMS,
        *coverage_failures.CLAIMS,
        *hybrid.CLAIMS,
        *pool.CLAIMS,
        *keys.CLAIMS,
    ]
