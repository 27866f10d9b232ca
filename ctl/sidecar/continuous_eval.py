"""`--mode=continuous_eval`: a sidecar evaluator that watches a trainer's model dir.

    python -m ctl.run --mode=continuous_eval --model_dir=DIR \\
        --gin_bindings="ctl.ContinuousEval.policy='latest'"

The loop (eager, on the host; `ctl.sidecar.scheduler.Scheduler` makes each decision):

    while True:
      present = checkpoints in DIR (NAME-N.index)     # every poll_interval
      ready = those committed; seen earlier, now gone, unhandled -> `deleted`
      decision = scheduler.decide(ready, final checkpoint if finished, present)
      EVALUATE: restore the model (validated), then for each eval set
                  trainer.evaluate(eval_steps)  -- the Trainer's own evaluation
                write summaries at the checkpoint's global step, one JSON line
                to eval/metrics.jsonl, then eval/sidecar_progress.json (atomic)
      WAIT: sleep; FINISHED / MAX_EVALUATIONS: return; TIMEOUT: UserError

A checkpoint is committed once the `checkpoint` state file names it, or its
index file is `settle_seconds` old (tf_keras' `ModelCheckpoint` names only the
newest). Three checkpoint layouts restore: ctl's and `tf.train.Checkpoint(
model=..., optimizer=...)` (a `model` object at the root), and tf_keras'
`save_weights` (the model is the root). Only the model is read; the
optimizer's values stay unread.
"""

import json
import logging as std_logging
import os
import re
import time
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from ctl.core import config, console
from ctl.core.checkpoint_contents import MODEL, SavedGraph, saved_step
from ctl.core.checkpointing import UnreadableCheckpointError, restore
from ctl.core.errors import UserError
from ctl.core.hooks import Hooks, Run
from ctl.core.summaries import SummaryManager
from ctl.sidecar import scheduler as sidecar

FINISHED_FILE = "ctl_run_finished.json"
PROGRESS_FILE = "sidecar_progress.json"
METRICS_FILE = "metrics.jsonl"
EVAL_DIR = "eval"  # As ctl.train_lib.EVAL_SUMMARY_DIR.
_INDEX = re.compile(r"^(.+)-(\d+)\.index$")


# The trainer's side: "this run is finished".


def mark_finished(model_dir: str, step: int) -> None:
    """Records (atomically) that training ended, and its final checkpoint."""
    latest = tf.train.latest_checkpoint(model_dir)
    text = json.dumps({"final_step": step, "final_checkpoint": latest and os.path.basename(latest)})
    config.write_atomically(os.path.join(model_dir, FINISHED_FILE), text + "\n")


def clear_finished(model_dir: str) -> None:
    """Called when training (re)starts: the run is no longer finished."""
    path = os.path.join(model_dir, FINISHED_FILE)
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def final_checkpoint_number(model_dir: str) -> Optional[int]:
    """The number of the trainer's final checkpoint, once it marked the run finished."""
    try:
        with tf.io.gfile.GFile(os.path.join(model_dir, FINISHED_FILE)) as f:
            data = json.loads(f.read())
    except (tf.errors.NotFoundError, json.JSONDecodeError):
        return None
    match = _INDEX.match(f"{data.get('final_checkpoint')}.index")
    return int(match.group(2)) if match else int(data["final_step"])


# Watching the model dir.


def list_checkpoints(model_dir: str) -> Dict[int, str]:
    """Maps the number of every checkpoint in `model_dir` (`NAME-N.index`) to its path."""
    try:
        names = tf.io.gfile.listdir(model_dir)
    except tf.errors.NotFoundError:
        return {}
    found = {}
    for name in sorted(names):
        match = _INDEX.match(name)
        if match and not match.group(1).endswith("_temp"):
            found.setdefault(int(match.group(2)), os.path.join(model_dir, match.group(0)[:-6]))
    return found


def ready_checkpoints(model_dir: str, settle_seconds: float,
                      found: Optional[Dict[int, str]] = None) -> Dict[int, str]:
    """The checkpoints (of `found`) that are committed: named in the state file, or settled."""
    found = list_checkpoints(model_dir) if found is None else found
    if not found:
        return found
    named = set()
    try:
        state = tf.train.get_checkpoint_state(model_dir)
    except (tf.errors.OpError, ValueError):  # Being replaced; look again next poll.
        state = None
    if state is not None:
        paths = [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
        named = {os.path.basename(p) for p in paths}
    ready = {}
    now = time.time()
    for number, path in found.items():
        if os.path.basename(path) in named:
            ready[number] = path
            continue
        try:
            mtime = tf.io.gfile.stat(path + ".index").mtime_nsec / 1e9
        except tf.errors.NotFoundError:
            continue
        if now - mtime >= settle_seconds:
            ready[number] = path
    return ready


def wait_for_config(model_dir: str, poll_interval: float = 0.5) -> str:
    """Waits for the trainer's `<model_dir>/config.gin` and returns its path."""
    path = os.path.join(model_dir, config.CONFIG_FILE)
    next_log = 0.0
    while not tf.io.gfile.exists(path):
        if time.monotonic() >= next_log:
            console.info("eval", "waiting for %s (the trainer writes it when it starts; or pass "
                         "--gin_file)", path)
            next_log = time.monotonic() + 60
        time.sleep(poll_interval)
    return path


# Evaluating one checkpoint.


class CheckpointEvaluator:
    """Restores checkpoints into a Trainer's model and runs its evaluation (eager)."""

    def __init__(self, experiment, strategy: tf.distribute.Strategy,
                 eval_dir: str, callbacks=()):
        task = experiment.task
        # The trainer's own evaluation: every eval set, as in-line (Trainer.evaluate).
        self.trainer = experiment.trainer_cls(task, strategy=strategy, train=False, evaluate=True)
        self.model = self.trainer.eval_model  # The moving average, with ctl.Trainer.ema_decay.
        self.eval_steps = experiment.schedule.eval_steps or -1
        self.eval_dir = eval_dir
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if hasattr(callback, "set_model"):
                callback.set_model(self.model)
        self._summaries = None
        tf.get_logger().addFilter(_PartialRestoreNotice())

    def evaluate(self, number: int, path: str) -> Dict[str, Any]:
        """Restores `path` and evaluates it; raises `UnreadableCheckpointError`/`UserError`."""
        step = self._restore(number, path)
        results = self.trainer.evaluate(self.eval_steps, batch_callbacks=self.callbacks)
        return {"step": step, "results": _to_python(results)}

    def _restore(self, number: int, path: str) -> int:
        try:
            reader = tf.train.load_checkpoint(path)
            graph = SavedGraph(reader)
            step = saved_step(reader, graph, self.trainer.optimizer)
        except (tf.errors.OpError, IndexError, ValueError) as error:
            raise UnreadableCheckpointError(
                f"cannot read checkpoint {path} ({str(error).strip().splitlines()[0][:160]})",
                deleted=isinstance(error, tf.errors.NotFoundError),
            ) from error
        if step is None:
            step = number
        if MODEL in graph.root_children():  # ctl, tf.train.CheckpointManager
            checkpoint = tf.train.Checkpoint(**self.trainer.eval_restore_objects())
        else:
            checkpoint = tf.train.Checkpoint(root=self.model)  # tf_keras save_weights
        status = restore(_ReadOnly(checkpoint), path, os.path.dirname(path))
        status.expect_partial()  # The optimizer's values are not needed here.
        self.trainer.global_step.assign(step)
        return step

    def write_summaries(self, results: Dict[str, Any]) -> None:
        """Summaries at the restored global step; one subdirectory per named eval set."""
        if self._summaries is None:
            self._summaries = SummaryManager(self.eval_dir, self.trainer.global_step)
        self._summaries.write_summaries(results)
        self._summaries.flush()


# The loop.


def evaluate_continuously(
    model_dir: str,
    strategy: Optional[tf.distribute.Strategy] = None,
    *,
    experiment,
    settings: Optional[sidecar.ContinuousEval] = None,
    clock=time.monotonic,
) -> Dict[str, Any]:
    """Evaluates the checkpoints of `model_dir` until the trainer's last one.

    `experiment` is the run's `ctl.Experiment` (its task, trainer class,
    schedule and hooks).

    Returns the last evaluation's results. Raises `UserError` on an idle
    timeout, a checkpoint of a different model, or a final checkpoint that
    could not be read.
    """
    settings = settings or config.call_configured(sidecar.ContinuousEval)
    strategy = strategy or tf.distribute.get_strategy()
    eval_dir = os.path.join(model_dir, EVAL_DIR)
    progress = load_progress(eval_dir)
    console.info(
        "eval", "continuous eval of %s: policy=%s, timeout=%s s, max_evaluations=%s; %d "
        "checkpoint(s) already handled (%s)", model_dir, settings.policy, settings.timeout,
        settings.max_evaluations, len(progress.outcomes), os.path.join(eval_dir, PROGRESS_FILE))
    evaluator = CheckpointEvaluator(experiment, strategy, eval_dir, settings.callbacks)
    eval_end_hooks = _eval_side_hooks(experiment, evaluator, model_dir)
    scheduler = sidecar.Scheduler(settings, progress, clock=clock)
    last = {}
    waiting = False
    seen = {}
    while True:
        present = list_checkpoints(model_dir)
        ready = ready_checkpoints(model_dir, settings.settle_seconds, present)
        final = final_checkpoint_number(model_dir)
        _record_vanished(seen, present, progress, eval_dir)
        seen = dict(ready)
        decision = scheduler.decide(ready, final, present)
        if decision.kind == sidecar.WAIT:
            if not waiting:
                console.info("eval", "waiting for a new checkpoint in %s", model_dir)
                waiting = True
            time.sleep(settings.poll_interval)
            continue
        waiting = False
        if decision.kind == sidecar.EVALUATE:
            for number in decision.skipped:
                console.info("eval", "skipping %s: a newer checkpoint is ready (policy=latest)",
                             os.path.basename(ready[number]))
                progress.record(number, sidecar.SKIPPED)
            outcome, output = _evaluate_one(evaluator, decision.number, ready[decision.number],
                                            eval_end_hooks)
            progress.record(decision.number, outcome)
            save_progress(eval_dir, progress)
            last = output or last
            continue
        if decision.kind == sidecar.TIMEOUT:
            raise UserError(
                f"no new checkpoint in --model_dir={model_dir} for {settings.timeout:g} s "
                f"(ctl.ContinuousEval.timeout) and the trainer has not marked the run finished "
                f"({FINISHED_FILE}); check the trainer, or raise the timeout."
            )
        if decision.kind == sidecar.MAX_EVALUATIONS:
            console.info("eval", "stopping: %d evaluations reached ctl.ContinuousEval.max_evaluations",
                         progress.evaluations)
            return last
        outcome = progress.outcomes.get(final)
        if outcome in (sidecar.FAILED, sidecar.DELETED, None):
            raise UserError(
                f"the trainer's final checkpoint (number {final}) in --model_dir={model_dir} "
                f"could not be evaluated ({outcome or 'missing'}); see the log above."
            )
        console.info("eval", "finished: the trainer's final checkpoint (number %d) is %s", final, outcome)
        return last


def _record_vanished(seen: Dict[int, str], present: Dict[int, str],
                     progress: sidecar.Progress, eval_dir: str) -> None:
    """Checkpoints seen ready, now gone before their evaluation, are recorded `deleted`."""
    for number in sorted(set(seen) - set(present)):
        if not progress.handled(number):
            console.warning("eval", "skipping %s: deleted before its evaluation (e.g. by "
                            "max_checkpoints)", os.path.basename(seen[number]))
            progress.record(number, sidecar.DELETED)
            save_progress(eval_dir, progress)


def _eval_side_hooks(experiment, evaluator: CheckpointEvaluator, model_dir: str):
    """The `on_eval_end` actions of the experiment's hooks, bound to the evaluated checkpoint.

    Only the eval side runs here (exporters, best checkpoint): run-end hooks such
    as `FinalExporter` stay with the trainer, so the two never race for a file.
    """
    hooks = [hook for hook in experiment.hooks if callable(getattr(hook, "on_eval_end", None))]
    if not hooks:
        return []
    trainer = evaluator.trainer
    run = Run(model_dir=model_dir, model=trainer.eval_model, task=experiment.task,
              checkpoint=tf.train.Checkpoint(model=trainer.eval_model,
                                             global_step=trainer.global_step),
              global_step=trainer.global_step, strategy=trainer.strategy, chief=True)
    return Hooks(hooks, run).actions("on_eval_end")


def _evaluate_one(evaluator: CheckpointEvaluator, number: int, path: str, eval_end_hooks=()):
    name = os.path.basename(path)
    started = time.time()
    console.info("eval", "evaluating %s", name)
    try:
        output = evaluator.evaluate(number, path)
    except UnreadableCheckpointError as error:
        if error.deleted or not tf.io.gfile.exists(path + ".index"):
            console.warning("eval", "skipping %s: deleted before it could be read (e.g. by "
                            "max_checkpoints)", name)
            return sidecar.DELETED, None
        console.warning("eval", "skipping %s, recorded as failed: %s", name, error)
        return sidecar.FAILED, None
    evaluator.write_summaries(output["results"])
    record = {"checkpoint": name, "number": number, **output,
              "started": started, "finished": time.time()}
    append_metrics(evaluator.eval_dir, record)
    console.info("eval", "%s", console.format_logs(output["results"]), step=output["step"])
    for action in eval_end_hooks:
        action(output["results"])
    return sidecar.EVALUATED, output


# Progress and metrics files in the eval dir.


def load_progress(eval_dir: str) -> sidecar.Progress:
    """The progress file, plus every evaluation the metrics file records."""
    path = os.path.join(eval_dir, PROGRESS_FILE)
    text = None
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            text = f.read()
    progress = sidecar.Progress.from_json(text)
    for record in read_metrics(eval_dir):
        progress.record(int(record["number"]), sidecar.EVALUATED)
    return progress


def save_progress(eval_dir: str, progress: sidecar.Progress) -> None:
    tf.io.gfile.makedirs(eval_dir)
    config.write_atomically(os.path.join(eval_dir, PROGRESS_FILE), progress.to_json())


def read_metrics(eval_dir: str):
    """The records of `eval/metrics.jsonl`, one dict per evaluation."""
    path = os.path.join(eval_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return []
    records = []
    with tf.io.gfile.GFile(path) as f:
        for line in f.read().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # A line cut short by a kill.
                continue
    return records


def append_metrics(eval_dir: str, record: Dict[str, Any]) -> None:
    tf.io.gfile.makedirs(eval_dir)
    path = os.path.join(eval_dir, METRICS_FILE)
    prefix = ""
    if tf.io.gfile.exists(path):
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                prefix = "" if f.read(1) == b"\n" else "\n"
    with open(path, "a") as f:
        f.write(prefix + json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


class _PartialRestoreNotice(std_logging.Filter):
    """Drops TensorFlow's notices, when a checkpoint object is collected, about values
    it did not restore: the evaluator reads only the model, and reports a failed read
    itself, once."""

    def filter(self, record):
        message = record.getMessage()
        return not message.startswith((
            "Detecting that an object or model or tf.train.Checkpoint is being deleted",
            "Value in checkpoint could not be found in the restored object"))


class _ReadOnly:
    """`checkpoint.read` in place of `restore`: no `save_counter` to match (files
    written by `Model.save_weights` have none)."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        self._checkpoint = checkpoint

    def restore(self, path: str):
        return self._checkpoint.read(path)


def _to_python(value):
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()

