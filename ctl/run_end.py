"""What the end of a training run says, and whether a run is already complete.

The chief ends `train` and `train_and_eval` with a few lines:

     done | step:     20 | trained to step 20; final eval: loss: 0.0030312, examples: 10
     done | best: loss = 0.0030312 at step 20: /tmp/digits/best/ckpt-20/ckpt
     done | in /tmp/digits: checkpoints (latest ckpt-20), summaries train/ eval/, exports export/
     done | to look: python -m ctl.report --model_dir=/tmp/digits ; tensorboard --logdir /tmp/digits

The best line is the run's best once the final step is evaluated (an evaluation of
it is on record, in-line or the sidecar's). Before that (the in-line evaluation
stepped aside for a sidecar evaluator, or `train` left evaluation to one) it is
the best so far, and the line says which evaluation decides the run's best:

     done | best so far: AP = 0.0567 at step 250: /tmp/mg/best/ckpt-250/ckpt (step 300 is not
          | evaluated yet: its evaluation, e.g. by the sidecar evaluator, decides the run's best)

A run started again once it is complete (`completed_run`: the trainer marked
it finished at or past `train_steps`, its final checkpoint is there and, with
in-line evaluation, an evaluation of that step is on record) writes
nothing: it says so in the same lines and returns the recorded results.
Everything here reads the model dir through `ctl.model_dir` and runs
eagerly on the host.
"""

import dataclasses
import os
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from ctl.hooks.best import best_record
from ctl.hooks.exporting import EXPORT_DIR, export_best_record_files
from ctl.utils import console
from ctl.model_dir import ModelDir, at_once, read_json, results_of

KIND = "done"


def completed_run(directory: ModelDir, train_steps: int, evaluate: bool,
                  marked: Optional[bool] = None,
                  recorded: Optional[Callable[[], Dict[Any, Dict[str, Any]]]] = None
                  ) -> Optional[Dict[str, Any]]:
    """The final results of the run in `directory` if it is already complete, else None.

    Complete: the trainer marked it finished at step `train_steps` or later, its
    final checkpoint is there, and (if `evaluate`) an evaluation at that step is
    on record (`ModelDir.evaluations_on_record`). The results are that
    evaluation's (`{}` without `evaluate`). Reads only.

    Args:
        directory: the run's model dir.
        train_steps: the step the run trains to (`ctl.Schedule.train_steps`).
        evaluate: whether the mode evaluates (then an evaluation at the final step must be on record).
        marked: whether the run-finished marker is there, if already read (None: read here).
        recorded: `directory.evaluations_on_record`, or a function that returns what it read ahead.
    """
    if not (tf.io.gfile.exists(directory.finished_file) if marked is None else marked):
        return None
    final = directory.final_checkpoint_number()
    if final is None or final < train_steps or final not in directory.checkpoints():
        return None
    if not evaluate:
        return {}
    return (recorded or directory.evaluations_on_record)().get(final)


def say_complete(directory: ModelDir, train_steps: int, results: Dict[str, Any]) -> None:
    """Says that the run is already complete, nothing to do, and where its results are.

    Args:
        directory: the run's model dir.
        train_steps: the step the run was asked to train to.
        results: the recorded final results (`completed_run`).
    """
    step = directory.final_checkpoint_number()
    console.info(KIND, "the run is already complete (trained to step %d, ctl.Schedule.train_steps"
                 "=%d): nothing to do; a larger train_steps trains on", step, train_steps, step=step)
    say_done(directory, step, results, already=True)


@dataclasses.dataclass(frozen=True)
class Known:
    """What the run that ends knows of its model dir, not read again (None: read it).

    Args:
        latest: the path of the latest checkpoint (the one the state file names).
        evaluated: True if the final step is evaluated (on record, or by this run).
        train: True if `train/` holds summaries.
        eval: True if `eval/` holds summaries.
    """

    latest: Optional[str] = None
    evaluated: Optional[bool] = None
    train: Optional[bool] = None
    eval: Optional[bool] = None


def say_done(directory: ModelDir, step: int, results: Optional[Dict[str, Any]],
             already: bool = False, known: Known = Known(),
             written: Optional[Callable[[], Any]] = None) -> None:
    """The end of a run: the final (and best) metrics, where the files are, how to look.

    `results`: the final evaluation's; without one (`train`), the last train loop's.

    Args:
        directory: the run's model dir.
        step: the final global step.
        results: the final evaluation's results; without one (`train`), the last train loop's are read.
        already: True for a run that was already complete (says less).
        known: what the run knows (not read).
        written: waits for a write made meanwhile (the finished mark), before the first line;
            its error is raised.
    """
    # What the run knows, and the independent reads of the rest: side by side in an object
    # store (each a round trip).
    given: Dict[str, Any] = {"evaluated": known.evaluated, "latest": known.latest, "train": known.train,
             "eval": known.eval}
    reads = {
        "best": lambda: [best_record(directory)],  # Beside the exporters' (each a round trip).
        "best_exports": lambda: _export_best_records(directory),
        "evaluated": lambda: step in directory.evaluations_on_record(),
        "latest": lambda: directory.checkpoint_state().latest,
        "train": lambda: tf.io.gfile.isdir(directory.train_dir),
        "eval": lambda: tf.io.gfile.isdir(directory.eval_dir),
        "export": lambda: tf.io.gfile.isdir(directory.file(EXPORT_DIR)),
    }
    if not results:
        reads["loops"] = lambda: directory.metrics("train")
    found: Dict[str, Any] = {name: value for name, value in given.items() if value}
    try:
        found.update(at_once(directory.path, {name: read for name, read in reads.items()
                                              if name not in found}))
    finally:
        if written is not None:
            written()
    kind = "eval"
    if not results:
        kind = "train loop"
        loops = found["loops"]
        results = results_of(loops[-1]) if loops else {}
    final = f"final {kind}: {console.format_logs(results)}" if results else "no metrics recorded"
    if not already:
        console.info(KIND, "trained to step %d; %s", step, final, step=step)
    else:
        console.info(KIND, "%s", final, step=step)
    records = [r for r in found["best"] + found["best_exports"]
               if r and isinstance(r.get("value"), (int, float))]
    settled = not records or found["evaluated"]
    for record in records:
        if settled:
            console.info(KIND, "best: %s = %.6g at step %s: %s", record.get("metric"),
                         record.get("value"), record.get("step"), record.get("path"))
        else:
            console.info(KIND, "best so far: %s = %.6g at step %s: %s (step %d is not evaluated yet: its "
                         "evaluation, e.g. by the sidecar evaluator, decides the run's best)",
                         record.get("metric"), record.get("value"), record.get("step"),
                         record.get("path"), step)
    latest = found["latest"]
    where = [f"checkpoints (latest {os.path.basename(latest)})" if latest else "no checkpoint"]
    summaries = [path for path, there in ((directory.train_dir, found["train"]),
                                          (directory.eval_dir, found["eval"])) if there]
    if summaries:
        where.append("summaries " + " ".join(f"{os.path.basename(p)}/" for p in summaries))
    if found["export"]:
        where.append(f"exports {EXPORT_DIR}/")
    console.info(KIND, "in %s: %s", directory.path, ", ".join(where))
    console.info(KIND, "to look: python -m ctl.report --model_dir=%s ; tensorboard --logdir %s",
                 directory.path, directory.path)


def _export_best_records(directory: ModelDir):
    """Each `ctl.hooks.BestExporter`'s record, if any."""
    records = []
    for path in export_best_record_files(directory):
        record = read_json(path, {})
        if isinstance(record, dict) and record:
            records.append(record)
    return records

