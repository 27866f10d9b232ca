"""What the end of a training run says, and whether a run is already complete.

The chief ends `train` and `train_and_eval` with a few lines:

     done | step:     20 | trained to step 20; final eval: loss: 0.0030312, examples: 10
     done | best: loss = 0.0030312 at step 20: /tmp/digits/best/ckpt-20/ckpt
     done | in /tmp/digits: checkpoints (latest ckpt-20), summaries train/ eval/, exports export/
     done | to look: python -m ctl.report --model_dir=/tmp/digits ; tensorboard --logdir /tmp/digits

A run started again once it is complete (`completed_run`: the trainer marked
it finished at or past `train_steps`, its final checkpoint is there and, with
in-line evaluation, `metrics.jsonl` holds an evaluation of that step) writes
nothing: it says so in the same lines and returns the recorded results.
Everything here reads the model dir through `ctl.core.model_dir` and runs
eagerly on the host.
"""

import os
from typing import Any, Dict, Optional

import tensorflow as tf

from ctl.comforts.best import read_best
from ctl.comforts.progress import read_metrics
from ctl.core import console
from ctl.core.model_dir import EXPORT_DIR, ModelDir, read_json, read_json_lines

KIND = "done"
RECORD_FIELDS = ("kind", "step", "time")  # A metrics.jsonl record's own fields.


def completed_run(model_dir: str, train_steps: int, evaluate: bool) -> Optional[Dict[str, Any]]:
    """The final results of the run in `model_dir` if it is already complete, else None.

    Complete: the trainer marked it finished at step `train_steps` or later, its
    final checkpoint is there, and (if `evaluate`) `metrics.jsonl` records an
    evaluation at that step. The results are that evaluation's (`{}` without
    `evaluate`). Reads only.
    """
    directory = ModelDir(model_dir)
    if not tf.io.gfile.exists(directory.finished_file):
        return None
    final = directory.final_checkpoint_number()
    if final is None or final < train_steps or final not in directory.checkpoints():
        return None
    if not evaluate:
        return {}
    for record in read_metrics(model_dir, "eval"):
        if record.get("step") == final:
            return results_of(record)
    for record in read_json_lines(directory.sidecar_metrics_file):  # A sidecar evaluated it.
        if record.get("step") == final:
            return record.get("results") or {}
    return None


def say_complete(model_dir: str, train_steps: int, results: Dict[str, Any]) -> None:
    """Says that the run is already complete, nothing to do, and where its results are."""
    step = ModelDir(model_dir).final_checkpoint_number()
    console.info(KIND, "the run is already complete (trained to step %d, ctl.Schedule.train_steps"
                 "=%d): nothing to do; a larger train_steps trains on", step, train_steps, step=step)
    say_done(model_dir, step, results, already=True)


def say_done(model_dir: str, step: int, results: Optional[Dict[str, Any]],
             already: bool = False) -> None:
    """The end of a run: the final (and best) metrics, where the files are, how to look.

    `results`: the final evaluation's; without one (`train`), the last train loop's.
    """
    directory = ModelDir(model_dir)
    kind = "eval"
    if not results:
        kind = "train loop"
        loops = read_metrics(model_dir, "train")
        results = results_of(loops[-1]) if loops else {}
    final = f"final {kind}: {console.format_logs(results)}" if results else "no metrics recorded"
    if not already:
        console.info(KIND, "trained to step %d; %s", step, final, step=step)
    else:
        console.info(KIND, "%s", final, step=step)
    for record in _best_records(directory):
        console.info(KIND, "best: %s = %.6g at step %s: %s", record.get("metric"),
                     record.get("value"), record.get("step"), record.get("path"))
    latest = directory.checkpoint_state().latest
    where = [f"checkpoints (latest {os.path.basename(latest)})" if latest else "no checkpoint"]
    summaries = [name for name in ("train", "eval") if tf.io.gfile.isdir(directory.file(name))]
    if summaries:
        where.append("summaries " + " ".join(f"{name}/" for name in summaries))
    if tf.io.gfile.isdir(directory.file(EXPORT_DIR)):
        where.append(f"exports {EXPORT_DIR}/")
    console.info(KIND, "in %s: %s", model_dir, ", ".join(where))
    console.info(KIND, "to look: python -m ctl.report --model_dir=%s ; tensorboard --logdir %s",
                 model_dir, model_dir)


def _best_records(directory: ModelDir):
    """`ctl.hooks.BestCheckpoint`'s record and each `ctl.hooks.BestExporter`'s, if any."""
    records = [read_best(directory.path)]
    for path in sorted(tf.io.gfile.glob(directory.file(EXPORT_DIR, "*", "best.json"))):
        record = read_json(path, {})
        if isinstance(record, dict) and record:
            records.append(record)
    return [r for r in records if r and isinstance(r.get("value"), (int, float))]


def results_of(record: Dict[str, Any]) -> Dict[str, Any]:
    """The metrics of a `metrics.jsonl` record."""
    return {name: value for name, value in record.items() if name not in RECORD_FIELDS}
