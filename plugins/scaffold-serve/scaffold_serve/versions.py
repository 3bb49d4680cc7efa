"""Per-token weight versions: the one place that reads them from an engine result and writes them on a sample.

An engine reports the policy version that produced a result (``weight_version``), and may report one
version per output token (``versions``) when its weights change in the middle of a generation. Every
version the server records goes through :func:`token_versions`, and every sample it makes gets them
through :func:`with_versions`.
"""

from __future__ import annotations

from typing import Any

from scaffold_core.trajectory import version_number


def token_versions(result: Any) -> list[int]:
    """One version per output id: the result's own ``versions`` when it has them, else its ``weight_version``."""
    versions = getattr(result, "versions", None)
    if versions is not None:
        return [version_number(v) for v in versions]
    return [version_number(result.weight_version)] * len(result.output_ids)


def with_versions(sample: Any, versions: list[int]) -> Any:
    """``sample`` with its per-token output versions set, where the sample type has a field for them."""
    if "versions" in getattr(type(sample), "__dataclass_fields__", {}):
        sample.versions = list(versions)
    return sample
