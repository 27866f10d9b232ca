"""The zoo page's guarantee columns and their section (bench/model_garden_zoo/guarantees.py's
results, as `python -m bench.model_garden_zoo.page` renders them)."""

import re
from typing import Any, Dict, List

from bench.model_garden_zoo import guarantees

NAMES = {"kill_9": "kill -9", "sigterm": "SIGTERM", "sidecar": "sidecar", "new_replicas": "2 replicas"}


def _cell(column: str, result: Dict[str, Any]) -> str:
    holds = result.get("holds")
    if holds is None:
        return "-"
    if not holds:
        return "**no**"
    if column == "new_replicas":
        return f"yes (loss {result['max_rel_loss_diff']:.0e}, weights {result['max_rel_weight_diff']:.0e})"
    if column == "sigterm" and result.get("seconds_to_exit") is not None:
        return f"yes ({result['seconds_to_exit']:.0f} s)"
    return "yes"


def cells(row: Dict[str, Any]) -> str:
    """The row's four guarantee cells, joined by ` | ` ("not run" where the row has none).

    Args:
      row: a row of the results file.
    """
    found = row.get("guarantees")
    if not found:
        return " | ".join(["not run"] * len(guarantees.COLUMNS))
    return " | ".join(_cell(c, found.get(c, {})) for c in guarantees.COLUMNS)


def reason(row: Dict[str, Any]) -> str:
    """Why each guarantee of the row that does not hold (or was not run) does not: a line a user
    can check; '' where all hold.

    Args:
      row: a row of the results file.
    """
    found = row.get("guarantees") or {}
    said = [f"{NAMES[c]}: {found[c].get('detail', '')}" for c in guarantees.COLUMNS
            if c in found and (not found[c].get("holds") or found[c].get("beyond_reduction_order"))]
    if found and row.get("guarantees_note"):  # Columns run or compared again later.
        said.append(f"({row['guarantees_note']})")
    # The process's whole output was beside its model dir on the host that ran it.
    return re.sub(r" \(its output: [^)]*\)", "", "; ".join(said))


def section(rows: List[Dict[str, Any]]) -> List[str]:
    """The page's section on the guarantee columns: what each checks, how the run is seeded,
    how many rows hold each.

    Args:
      rows: the results file's rows.
    """
    run = [r for r in rows if r.get("guarantees")]
    counts = ", ".join(
        f"{NAMES[c]} {sum(bool(r['guarantees'].get(c, {}).get('holds')) for r in run)}"
        for c in guarantees.COLUMNS)
    commits = sorted({r.get("guarantees_commit") for r in run if r.get("guarantees_commit")})
    return [
        "## ctl's guarantees on each row",
        "",
        f"**{len(run)} of {len(rows)} rows checked** (" + (
            f"holding: {counts}; at commit {', '.join(f'`{c}`' for c in commits)}"
            if run else "none yet") + "); a row marked *not run* was not checked. "
        "`python -m bench.model_garden_zoo --guarantees` checks each row "
        "(`--guarantees=only`: those columns alone, the rest of the row kept), "
        "through `python -m ctl.run` processes, on the row's tiny variant with its real pipeline "
        "and augmentations, seeded as a user seeds a run: `ctl.FaultTolerance.seed = 1` in the gin "
        "file (it seeds Python, NumPy, TensorFlow and Keras, turns on TensorFlow's op determinism "
        "and makes tf_keras' dropout draw from generators the checkpoint holds). "
        f"{guarantees.STEPS} steps in loops of {guarantees.LOOP}, a checkpoint after each loop; a "
        "recorded task writes each step's loss bits from inside the "
        f"graph and holds step {guarantees.HOLD_AT} until told to go on, so that a process is "
        "stopped mid-loop in a step it knows.",
        "",
        f"- **kill -9**: killed in step {guarantees.HOLD_AT} after the checkpoint of step "
        f"{guarantees.LOOP}, then the same command: every step's loss and the final checkpoint, bit "
        "for bit, the uninterrupted run's.",
        f"- **SIGTERM** (seconds from the signal to the exit): sent in step {guarantees.HOLD_AT} and taken "
        "(the process says so) before the step ends: "
        "exit 75 before the next step with a checkpoint of that step (the documented bound: the "
        "step in progress, then the save), then the same command: bit for bit again.",
        "- **sidecar**: `--mode=continuous_eval` in its own process beside the killed and restarted "
        "trainer evaluates each checkpoint once, in order, with the experiment's own metrics and "
        "aggregation, exits 0 after the final one, and its results for the final checkpoint are "
        f"the uninterrupted run's in-line evaluation of it (within a relative "
        f"{guarantees.EVAL_TOLERANCE:g}).",
        f"- **2 replicas**: the run stopped by SIGTERM at step {guarantees.HOLD_AT} on one replica, "
        "resumed with `--cpu_replicas=2 --strategy=mirrored`: it goes on at the next step, each "
        "step reads the uninterrupted run's data (the float64 sum of its inputs, both replicas' "
        "added, the same within a relative "
        f"{guarantees.INPUT_TOLERANCE:g}) and its checkpoint counts the same examples read "
        "(`train_examples`). The cell gives the largest relative differences from that run of the "
        "last loop's loss and of any weight; the reason says where one is above "
        f"{guarantees.REPLICA_TOLERANCE:g}, more than a reduction order gives.",
        "",
        "Where a guarantee does not hold or could not be checked, the row's reason says why.",
    ]
