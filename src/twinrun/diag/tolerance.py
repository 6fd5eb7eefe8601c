"""When two diag values count as equal: the tolerance rule shared by `twinrun diff` and traces."""

from __future__ import annotations

import math


def values_equal(a: float, b: float, rel_tol: float = 1e-5, abs_tol: float = 1e-7) -> bool:
    """`|a-b| <= abs_tol + rel_tol*max(|a|,|b|)`; NaN equals NaN only; inf equals itself only."""
    if a == b:
        return True
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= abs_tol + rel_tol * max(abs(a), abs(b))


def relative_difference(a: float, b: float) -> float:
    """|a-b| / max(|a|,|b|): 0 when equal (NaN and NaN too), inf for NaN or inf against
    anything else."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))
