"""Reading the cluster a process belongs to from the `TF_CONFIG` variable.

    TF_CONFIG='{"cluster": {"chief": ["host:2222"], "evaluator": ["host:2223"]},
                "task": {"type": "chief", "index": 0}}'

Only the parsing lives here; strategies are chosen in `ctl.distribute`.
"""

import json
import os
from typing import Any, Dict, Optional

from ctl.errors import UserError


def tf_config(environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Returns the parsed `TF_CONFIG` (`{}` when unset); malformed -> `UserError`."""
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(
            f"TF_CONFIG is not valid JSON ({error}): {text[:80]!r}; set it to e.g. "
            '\'{"cluster": {"worker": ["host:port"]}, "task": {"type": "worker", "index": 0}}\'.'
        ) from error
    if not isinstance(value, dict) or not isinstance(value.get("cluster", {}), dict):
        raise UserError(
            f"TF_CONFIG must be a JSON object whose 'cluster' maps job names to address "
            f"lists; got {text[:80]!r}."
        )
    return value


def has_evaluator(environ: Optional[Dict[str, str]] = None) -> bool:
    """Whether `TF_CONFIG`'s cluster has an `evaluator` job (a sidecar evaluator)."""
    return bool(tf_config(environ).get("cluster", {}).get("evaluator"))
