"""Diagnostics: exact checksums, the diag.jsonl recorder, first-divergence comparison, advice,
the heatmap report, and what two runs' sidecars record differently.

Attributes are loaded lazily so that `import twinrun.diag.compare` (what `twinrun diff` needs)
imports neither torch nor numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "sumsq": "checksum",
    "SumSq": "checksum",
    "digest": "checksum",
    "digest_many": "checksum",
    "DiagRecorder": "recorder",
    "LeafValue": "recorder",
    "StepRecord": "recorder",
    "STANDARD_LEAVES": "recorder",
    "DIAG_FORMAT": "recorder",
    "leaf_value": "recorder",
    "compare": "compare",
    "CompareResult": "compare",
    "Divergence": "compare",
    "LeafDiff": "compare",
    "advice_for": "advice",
    "Advice": "advice",
    "write_report": "report",
    "RecordedDifference": "recorded",
    "read_sidecar": "recorded",
    "recorded_differences": "recorded",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'twinrun.diag' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"twinrun.diag.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
