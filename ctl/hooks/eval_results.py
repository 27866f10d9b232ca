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

    Args:
        logs: a hook's `logs`, possibly nested by eval set (None: empty).
        prefix: prepended to every key (used for the recursion).

    Returns:
        A flat dict, `{"set/name": value}` for nested values.
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
    naming the metrics there are.

    Args:
        logs: the evaluation's results by metric name (named eval sets nested, `{set: {metric: value}}`).
        metric: the evaluation result compared, by name (`"set/name"` for a named eval set, e.g. `"val/accuracy"`).
        hook: the hook named in the error, e.g. `ctl.hooks.EarlyStopping`.

    Returns:
        The value as a Python float.

    Raises:
        UserError: `metric` is not in `logs`.
    """
    flat = flat_logs(logs)
    if metric not in flat:
        raise UserError(
            f"{hook}.metric={metric!r} is not among the evaluation results "
            f"({', '.join(sorted(flat))}); bind {hook}.metric to one of them."
        )
    return float(orbit.utils.get_value(flat[metric]))


def improved(value: float, best: Optional[float], higher_is_better: bool,
             min_delta: float = 0.0) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (NaN never does).

    Args:
        value: the new value.
        best: the best so far, or None (anything improves on none).
        higher_is_better: True when a larger value is better (accuracy), False when smaller is (loss).
        min_delta: the margin `value` must beat `best` by.

    Returns:
        True when `value` is an improvement.
    """
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best + min_delta if higher_is_better else value < best - min_delta
