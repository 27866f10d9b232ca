"""Evaluation results as hooks read them: named sets, one metric, an improvement.

Named eval sets reach hooks as nested dicts; `flat_logs` and `metric_value`
name their metrics "set/name" (as TensorBoard does); `improved` is the one
comparison the best checkpoint (and the best exporter through it) and early
stopping share.
"""

import math
from typing import Any, Dict, Optional

import orbit

from ctl.utils.errors import UserError


def flat_logs(logs, prefix: str = "") -> Dict[str, Any]:
    """`logs` with nested dicts (named eval sets) flattened to "set/name" keys.

    The same names TensorBoard shows: orbit writes a nested dict's values to a
    subdirectory per set.
    """
    flat = {}
    for name, value in (logs or {}).items():
        if isinstance(value, dict):
            flat.update(flat_logs(value, f"{prefix}{name}/"))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def metric_value(logs, metric: str, hook: str) -> float:
    """`logs[metric]` as a float ("set/name" for a named eval set), or a `UserError`
    naming the metrics there are."""
    flat = flat_logs(logs)
    if metric not in flat:
        raise UserError(
            f"{hook}.metric={metric!r} is not among the evaluation results "
            f"({', '.join(sorted(flat))}); bind {hook}.metric to one of them."
        )
    return float(orbit.utils.get_value(flat[metric]))


def improved(value: float, best: Optional[float], higher_is_better: bool,
             min_delta: float = 0.0) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (NaN never does)."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best + min_delta if higher_is_better else value < best - min_delta
