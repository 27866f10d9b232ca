"""The zoo page's guarantee columns and their section (bench/model_garden_zoo/guarantees.py's
results, as `python -m bench.model_garden_zoo.page` renders them)."""

import re
import textwrap
from typing import Any, Dict, List, Tuple

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
        "and makes tf_keras' dropout draw from generators the checkpoint holds), and "
        "`ctl.FaultTolerance.stateless_random_ops = True` (the train step's draws from "
        "`tf.random` made functions of the step; rows checked before the setting existed make no "
        "such draw, and it changes nothing in them). "
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
        f"the in-line evaluation of that same checkpoint (within a relative "
        f"{guarantees.EVAL_TOLERANCE:g}): the uninterrupted run's where kill -9 left the final "
        "checkpoint bit for bit that run's, else the killed run's final checkpoint evaluated "
        "as in-line evaluation evaluates it (`--mode=eval` on a copy of it in a dir of its own).",
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


# docs/explanation/guarantees.md: each guarantee's "*Model Garden*" item, written from the results
# (`docs_items`, by `python -m bench.model_garden_zoo.page`), ends with its column's marker.
WHAT = {
    "kill_9": "every step's loss and the final checkpoint after `kill -9` and the same command, bit for bit",
    "sigterm": "SIGTERM in a step, exit 75, then the same command: bit for bit",
    "sidecar": "each checkpoint once, in order, beside a killed and restarted trainer, equal to the "
               "in-line evaluation",
    "new_replicas": "one replica to two (`--cpu_replicas=2 --strategy=mirrored`) at the same step, "
                    "every step on the uninterrupted run's data",
}
TABLE = "[the zoo table](../how-to/model-garden-zoo.md#ctls-guarantees-on-each-row)"


def marker(column: str) -> str:
    return f"<!-- zoo:{column} -->"


def _why_not(result: Dict[str, Any]) -> str:
    detail = result.get("detail", "")
    if "draws from stateful random ops" in detail:
        return "their train steps draw from stateful random ops"
    # Results recorded before the sidecar was held against the killed run's own checkpoint.
    if result.get("holds") is None and "not comparable" in detail:
        return "not comparable: kill -9 changed the checkpoints it evaluates"
    if guarantees.TENSORFLOW_PER_PROCESS in detail:
        return ("Model Garden's own train step, with no ctl code, gives their gradients one of several "
                "ways per process")
    if "not found yet" in detail:
        return "not explained yet"
    return "the zoo table says why"


def docs_item(rows: List[Dict[str, Any]], column: str) -> str:
    """The "*Model Garden*" item of the guarantee `column` on docs/explanation/guarantees.md:
    the families and rows it holds on, the rows it does not (grouped by why), the rows not checked.

    Args:
      rows: the results file's rows.
      column: one of `guarantees.COLUMNS`.
    """
    holds: Dict[str, List[str]] = {}
    not_held: Dict[str, List[str]] = {}
    unchecked = 0
    for row in rows:
        result = (row.get("guarantees") or {}).get(column)
        if not result or (result.get("holds") is None and "not comparable" not in result.get("detail", "")):
            unchecked += 1
        elif result.get("holds"):
            holds.setdefault(row.get("family") or "other", []).append(row["experiment"])
        else:
            not_held.setdefault(_why_not(result), []).append(row["experiment"])
    names = lambda found: ", ".join(f"`{n}`" for n in sorted(found))  # noqa: E731
    text = (f"- *Model Garden* (seeded, with `stateless_random_ops`, `python -m ctl.run`, default strategy, local "
            f"disk): {WHAT[column]}, "
            f"on {sum(map(len, holds.values()))} of {len(rows)} rows: " +
            ("; ".join(f"{family} ({names(found)})" for family, found in sorted(holds.items()))
             or "none yet"))
    # Rows checked with TensorFlow's CPU kernels one op at a time and without oneDNN (their
    # details say so: `guarantees.cpu_settings`), which a user of those models sets too.
    settings = sorted({re.search(r"its processes started with ([^)]*)\)", result["detail"]).group(1)
                       for row in rows for result in [(row.get("guarantees") or {}).get(column) or {}]
                       if result.get("holds") and "its processes started with" in result.get("detail", "")})
    held = sum(map(len, holds.values()))
    for setting in settings:
        found = [row["experiment"] for row in rows
                 if f"started with {setting})" in ((row.get("guarantees") or {}).get(column) or {}).get("detail", "")
                 and ((row.get("guarantees") or {}).get(column) or {}).get("holds")]
        text += (f" (each with `{setting}`)" if len(found) == held else
                 f" ({names(found)} with `{setting}`)")
    if not_held:
        text += "; not on " + "; ".join(f"{names(found)} ({why})" for why, found in sorted(not_held.items()))
    if unchecked:
        text += f"; {unchecked} rows not checked"
    text += f": {TABLE}."
    return textwrap.fill(text, width=116, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False) + " " + marker(column)


def docs_items(page: str, rows: List[Dict[str, Any]]) -> Tuple[str, List[str]]:
    """`page` (docs/explanation/guarantees.md) with each column's item written anew (`docs_item`),
    and the columns whose marker it lacks.

    Args:
      page: the page's text.
      rows: the results file's rows.
    """
    missing = []
    for column in guarantees.COLUMNS:
        pattern = re.compile(r"^- \*Model Garden\*(?:(?!\n- |\n\n).)*?" + re.escape(marker(column)) + "$",
                             re.S | re.M)
        page, count = pattern.subn(lambda _: docs_item(rows, column), page)
        if count != 1:
            missing.append(column)
    return page, missing
