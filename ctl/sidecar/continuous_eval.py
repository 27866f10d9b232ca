"""`--mode=continuous_eval`: a sidecar evaluator that watches a trainer's model dir.

    python -m ctl.run --mode=continuous_eval --model_dir=DIR \\
        --gin_bindings="ctl.ContinuousEval.policy='latest'"

The loop (eager, on the host; `ctl.sidecar.scheduler.Scheduler` makes each decision):

    while True:
      present = checkpoints in DIR (NAME-N.index)     # every poll_interval
      ready = those committed; seen earlier, now gone, unhandled -> `deleted`
      decision = scheduler.decide(ready, final checkpoint if finished, present)
      EVALUATE: restore the model (validated), then for each eval set
                  trainer.evaluate(eval_steps)  -- the Trainer's own evaluation,
                                                   with the hooks' Keras callbacks
                write summaries at the checkpoint's global step, one JSON line
                to eval/metrics.jsonl, then eval/sidecar_progress.json (atomic)
      WAIT: sleep; FINISHED / MAX_EVALUATIONS: return; TIMEOUT: UserError

SIGTERM or SIGINT (Ctrl-C) stops the sidecar at its next look at the model
dir: at once while it waits (for `config.gin` or a checkpoint), after the
evaluation in progress otherwise; it raises `Stopped` (`python -m ctl.run`:
one line, exit 75, as the trainer) and a restart goes on where it stopped.
A second signal ends the process at once with `128 + signum`. The signals are
watched as the trainer's are (`ctl.core.stop.SignalWatcher`).

A checkpoint is committed once the `checkpoint` state file names it, or its
index file is `settle_seconds` old (tf_keras' `ModelCheckpoint` names only the
newest). Three checkpoint layouts restore: ctl's and `tf.train.Checkpoint(
model=..., optimizer=...)` (a `model` object at the root), and tf_keras'
`save_weights` (the model is the root). Only the model is read; the
optimizer's values stay unread.
"""

import logging as std_logging
import os
import signal
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from ctl.config import gin_config as config
from ctl import model_dir as files
from ctl.model_dir import staging
from ctl.utils import console
from ctl.model_dir.background import uploads
from ctl.core.checkpoint_contents import MODEL, SavedGraph, saved_step
from ctl.core.checkpointing import UnreadableCheckpointError, restore
from ctl.utils.errors import UserError, first_line
from ctl.model_dir.evaluator_role import SIDECAR, EvaluatorRole
from ctl.core.hook_protocol import Hooks, Run, eval_callbacks
from ctl.model_dir import ModelDir, checkpoint_files, checkpoint_index, is_object_store
from ctl.core.stop import SignalWatcher
from ctl.core.summaries import SummaryManager
from ctl.sidecar import scheduler as sidecar

SIDECAR_PROGRESS_FILE = "sidecar_progress.json"  # In the eval dir: what the sidecar did with each checkpoint.

class Stopped(Exception):
    """The sidecar stopped on a signal, between two evaluations.

    Args:
        signum: the signal that stopped the sidecar.
        evaluations: evaluations done before it, or None.
    """

    def __init__(self, signum: int, evaluations: Optional[int] = None):
        self.signum = signum
        done = "" if evaluations is None else f" after {evaluations} evaluation(s)"
        super().__init__(f"{signal.Signals(signum).name} stopped the evaluator{done}; nothing is "
                         "lost. Run the same command again to go on.")


def _check(signals: SignalWatcher, evaluations: Optional[int] = None) -> None:
    """Raises `Stopped` once a signal came (the sidecar's loop looks between evaluations)."""
    if signals.requested():
        raise Stopped(signals.signum, evaluations)


def wait_for_config(directory: ModelDir, timeout: Optional[float],
                    poll_interval: float = 0.5) -> str:
    """Waits for the trainer's `<model_dir>/config.gin` and returns its path.

    Raises `UserError` when `directory` is not a directory or after `timeout`
    seconds (None: no limit) without the file, and `Stopped` on SIGTERM or SIGINT.

    Args:
        directory: the trainer's model dir.
        timeout: seconds to wait (None: no limit).
        poll_interval: seconds between looks.
    """
    with SignalWatcher(train=False) as signals:
        return _wait_for_config(directory, timeout, poll_interval, signals)


def _wait_for_config(directory: ModelDir, timeout: Optional[float], poll_interval: float,
                     signals: SignalWatcher) -> str:
    path = directory.config_file
    start = next_log = time.monotonic()
    while not tf.io.gfile.exists(path):
        _check(signals)
        if directory.is_file():
            raise UserError(f"--model_dir={directory} is a file, not a directory; point it at "
                            "the trainer's model dir.")
        now = time.monotonic()
        if timeout is not None and now - start >= timeout:
            raise UserError(
                f"no {path} after {timeout:g} s (ctl.ContinuousEval.timeout): the trainer "
                "writes it when it starts; start the trainer, or pass its --gin_file.")
        if now >= next_log:
            console.info("eval", "waiting for %s (the trainer writes it when it starts; or pass "
                         "--gin_file)", path)
            next_log = now + 60
        time.sleep(poll_interval)
    return path


# Evaluating one checkpoint.


class CheckpointEvaluator:
    """Restores checkpoints into a Trainer's model and runs its evaluation (eager)."""

    def __init__(self, experiment, strategy: tf.distribute.Strategy, directory: ModelDir):
        task = experiment.task
        # The trainer's own evaluation: every eval set, and the hooks' Keras callbacks
        # (`ctl.hooks.KerasCallbacks`), as in-line (Trainer.evaluate).
        self.trainer = experiment.trainer_cls(task, strategy=strategy, train=False, evaluate=True,
                                              eval_callbacks=eval_callbacks(experiment.hooks))
        self.model = self.trainer.eval_model  # The moving average, with ctl.Trainer.ema_decay.
        self.eval_steps = experiment.schedule.eval_steps or -1
        self.directory = directory
        self.eval_dir = directory.eval_dir
        self.metrics_file = directory.sidecar_metrics_file
        self._summaries: Optional[SummaryManager] = None
        tf.get_logger().addFilter(_PartialRestoreNotice())

    def evaluate(self, number: int, path: str) -> Dict[str, Any]:
        """Restores `path` and evaluates it; raises `UnreadableCheckpointError`/`UserError`."""
        step = self._restore(number, path)
        results = self.trainer.evaluate(self.eval_steps)
        return {"step": step, "results": _to_python(results)}

    def _restore(self, number: int, path: str) -> int:
        if not is_object_store(path):
            return self._restore_from(number, path, path)
        # In an object store each read of the restore is a request: one copy of the files
        # to a local dir first (faster at an object store's latency: bench figure 9, docs/bench.md).
        local = staging.directory("restore")
        try:
            try:
                remotes = checkpoint_files(path)
            except tf.errors.OpError as error:
                raise _unreadable(path, error) from error
            for remote in remotes:
                _download(remote, os.path.join(local, os.path.basename(remote)), path)
            return self._restore_from(number, path, os.path.join(local, os.path.basename(path)))
        finally:
            staging.remove(local)

    def _restore_from(self, number: int, path: str, readable: str) -> int:
        """Restores checkpoint `path`, read at `readable` (the same, or a local copy)."""
        try:
            reader = tf.train.load_checkpoint(readable)
            graph = SavedGraph(reader)
            step = saved_step(reader, graph, self.trainer.optimizer)
        except (tf.errors.OpError, IndexError, ValueError) as error:
            raise UnreadableCheckpointError(
                f"cannot read checkpoint {path} ({first_line(error)})",
                deleted=isinstance(error, tf.errors.NotFoundError),
            ) from error
        if step is None:
            step = number
        if MODEL in graph.root_children():  # ctl, tf.train.CheckpointManager
            checkpoint = tf.train.Checkpoint(**self.trainer.eval_restore_objects())
        else:
            checkpoint = tf.train.Checkpoint(root=self.model)  # tf_keras save_weights
        # The optimizer's values stay unread (restore allows it).
        restore(_ReadOnly(checkpoint), readable, self.directory, fix=(
            "evaluate it with the trainer's config: its --gin_file and --gin_bindings, or "
            f"neither to read {self.directory.config_file}, if the trainer wrote the checkpoint"))
        self.trainer.global_step.assign(step)
        return step

    def write_summaries(self, results: Dict[str, Any]) -> None:
        """Summaries at the restored global step; one subdirectory per named eval set.

        Args:
            results: the evaluation's results, nested by eval set with named sets.
        """
        if self._summaries is None:
            self._summaries = SummaryManager(self.eval_dir, self.trainer.global_step)
        self._summaries.write_summaries(results)
        self._summaries.flush()
        uploads().wait()  # In the store before the evaluation's record (object stores).

    def close(self) -> None:
        """Removes the summaries' staging dir (object stores)."""
        if self._summaries is not None:
            self._summaries.close()


_CHUNK_BYTES = 16 << 20


def _download(remote: str, local: str, path: str) -> None:
    """Copies `remote`, a file of checkpoint `path` in an object store, to the local file `local`.

    A read the store refuses is the checkpoint's: `UnreadableCheckpointError`
    (recorded, never evaluated). A write the local disk refuses (no space) is
    the disk's: its `OSError`, naming `local`, ends the sidecar as a storage
    fault (`python -m ctl.run`: one line, exit 74), and a restart evaluates it.
    """
    try:
        with open(local, "wb") as target:
            for chunk in _chunks(remote, path):
                target.write(chunk)
    except OSError as error:
        if error.filename is None:  # A failed write names no file.
            raise OSError(error.errno, error.strerror, local) from error
        raise


def _chunks(remote: str, path: str):
    try:
        with tf.io.gfile.GFile(remote, "rb") as source:
            while True:
                chunk = source.read(_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
    except tf.errors.OpError as error:
        raise _unreadable(path, error) from error


def _unreadable(path: str, error: tf.errors.OpError) -> UnreadableCheckpointError:
    return UnreadableCheckpointError(f"cannot read checkpoint {path} ({first_line(error)})",
                                     deleted=isinstance(error, tf.errors.NotFoundError))


# The loop.


def evaluate_continuously(
    directory: ModelDir,
    strategy: Optional[tf.distribute.Strategy] = None,
    *,
    experiment,
    settings: Optional[sidecar.ContinuousEval] = None,
    clock=time.monotonic,
) -> Dict[str, Any]:
    """Evaluates the checkpoints of `directory` until the trainer's last one.

    `experiment` is the run's `ctl.Experiment` (its task, trainer class,
    schedule and hooks).

    Returns the last evaluation's results. Raises `UserError` on an idle
    timeout, a checkpoint of a different model, or a final checkpoint that
    could not be read, and `Stopped` on SIGTERM or SIGINT (between evaluations).

    Args:
        directory: the trainer's model dir.
        strategy: the strategy to evaluate under (None: the current one).
        experiment: the run's `ctl.Experiment` (its task, trainer class, schedule and hooks).
        settings: the sidecar's settings (None: the gin-configured `ctl.ContinuousEval`).
        clock: the time source of the idle timeout (a test may pass its own).
    """
    settings = settings or config.call_configured(sidecar.ContinuousEval)
    strategy = strategy or tf.distribute.get_strategy()
    if directory.is_file():
        raise UserError(f"--model_dir={directory} is a file, not a directory; point it at the "
                        "trainer's model dir.")
    progress = load_progress(directory)
    console.info(
        "eval", "continuous eval of %s: policy=%s, timeout=%s s, max_evaluations=%s; %d "
        "checkpoint(s) already handled (%s)", directory.path, settings.policy, settings.timeout,
        settings.max_evaluations, len(progress.outcomes), directory.file(files.EVAL_DIR, SIDECAR_PROGRESS_FILE))
    evaluator = CheckpointEvaluator(experiment, strategy, directory)
    role, hooks = _evaluator_role(experiment, evaluator, directory)
    try:
        # A trainer evaluating in-line steps aside while this sidecar holds the role.
        role.announce()
        with SignalWatcher(train=False) as signals:
            last = _watch(directory, settings, evaluator, progress, role, clock,
                          experiment.schedule.train_steps, signals)
        # The evaluations' normal end, for the hooks that take part in each (Keras callbacks'
        # on_train_end); other run-end hooks (FinalExporter) stay with the trainer.
        for hook in hooks:
            if eval_callbacks([hook]):
                hook.on_trial_close(last)
        return last
    finally:
        try:
            evaluator.close()
        finally:
            role.release()


def _watch(directory: ModelDir, settings: sidecar.ContinuousEval, evaluator: "CheckpointEvaluator",
           progress: sidecar.Progress, role: EvaluatorRole, clock,
           train_steps: Optional[int], signals: SignalWatcher) -> Dict[str, Any]:
    """The loop of the module docstring. A finished marker of a run asked for fewer
    than `train_steps` is stale (a trainer extending the run has not cleared it yet)."""
    model_dir = directory.path
    said_stale = False
    scheduler = sidecar.Scheduler(settings, progress, clock=clock)
    last = {}
    waiting = False
    seen = {}
    while True:
        _check(signals, progress.evaluations)
        present = directory.checkpoints()
        ready = directory.committed_checkpoints(settings.settle_seconds, present)
        final = directory.final_checkpoint_number(train_steps)
        if final is None and not said_stale and directory.final_checkpoint_number() is not None:
            console.info("eval", "%s marks a run of fewer steps than ctl.Schedule.train_steps "
                         "(%d): waiting for the trainer to go on", directory.finished_file,
                         train_steps)
            said_stale = True
        _record_vanished(seen, present, progress, directory)
        seen = dict(ready)
        decision = scheduler.decide(ready, final, present)
        if decision.kind == sidecar.WAIT:
            if not waiting:
                console.info("eval", "waiting for a new checkpoint in %s", model_dir)
                role.take_over()  # The role, if a trainer evaluating in-line held it.
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
                                            role)
            progress.record(decision.number, outcome)
            save_progress(directory, progress)
            last = output or last
            continue
        if decision.kind == sidecar.TIMEOUT:
            raise UserError(
                f"no new checkpoint in --model_dir={model_dir} for {settings.timeout:g} s "
                f"(ctl.ContinuousEval.timeout) and the trainer has not marked the run finished "
                f"({files.FINISHED_FILE}); check the trainer, or raise the timeout."
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
                     progress: sidecar.Progress, directory: ModelDir) -> None:
    """Checkpoints seen ready, now gone before their evaluation, are recorded `deleted`."""
    for number in sorted(set(seen) - set(present)):
        if not progress.handled(number):
            console.warning("eval", "skipping %s: deleted before its evaluation (e.g. by "
                            "max_checkpoints)", os.path.basename(seen[number]))
            progress.record(number, sidecar.DELETED)
            save_progress(directory, progress)


def _evaluator_role(experiment, evaluator: CheckpointEvaluator,
                    directory: ModelDir) -> Tuple[EvaluatorRole, List[Any]]:
    """The sidecar's role, with the `on_eval_end` actions of the experiment's hooks bound to
    the evaluated checkpoint, run only if this process owns them (`ctl.model_dir.evaluator_role`),
    and those hooks.

    Only the eval side runs here (exporters, best checkpoint): run-end hooks such
    as `FinalExporter` stay with the trainer, so the two never race for a file.
    """
    hooks = [hook for hook in experiment.hooks if callable(getattr(hook, "on_eval_end", None))]
    actions = []
    if hooks:
        trainer = evaluator.trainer
        run = Run(directory=directory, model=trainer.eval_model, task=experiment.task,
                  checkpoint=tf.train.Checkpoint(model=trainer.eval_model,
                                                 global_step=trainer.global_step),
                  global_step=trainer.global_step, strategy=trainer.strategy, chief=True)
        actions = Hooks(hooks, run).actions("on_eval_end")
    return EvaluatorRole(directory, SIDECAR, actions), hooks


def _evaluate_one(evaluator: CheckpointEvaluator, number: int, path: str,
                  role: Optional[EvaluatorRole] = None):
    name = os.path.basename(path)
    started = time.time()
    if role is not None:
        role.take_over()  # The role, if its holder let it go: a trainer then steps aside.
    console.info("eval", "evaluating %s", name)
    try:
        output = evaluator.evaluate(number, path)
    except UnreadableCheckpointError as error:
        if error.deleted or not tf.io.gfile.exists(checkpoint_index(path)):
            console.warning("eval", "skipping %s: deleted before it could be read (e.g. by "
                            "max_checkpoints)", name)
            return sidecar.DELETED, None
        console.warning("eval", "skipping %s, recorded as failed: %s", name, error)
        return sidecar.FAILED, None
    evaluator.write_summaries(output["results"])
    console.info("eval", "%s", console.format_logs(output["results"]), step=output["step"])
    if role is not None:
        role.take_over()  # Again: a trainer's in-line evaluation may have held it just now.
        # Before the record that makes the evaluation done: a restart after a kill
        # during an export evaluates this checkpoint again and finishes it.
        role(output["results"])
    record = {"checkpoint": name, "number": number, **output,
              "started": started, "finished": time.time()}
    files.append_json_line(evaluator.metrics_file, record)
    return sidecar.EVALUATED, output


# The progress record and the metrics of the eval dir.


def load_progress(directory: ModelDir) -> sidecar.Progress:
    """The progress record, plus every evaluation `eval/metrics.jsonl` records.

    A progress record that cannot be read is ignored (one WARNING): the
    metrics file still says which checkpoints were evaluated.

    Args:
        directory: the model dir.
    """
    progress = sidecar.Progress.from_record(files.read_json(directory.file(files.EVAL_DIR, SIDECAR_PROGRESS_FILE)))
    for record in directory.sidecar_evaluations():
        progress.record(int(record["number"]), sidecar.EVALUATED)
    return progress


def save_progress(directory: ModelDir, progress: sidecar.Progress) -> None:
    """Writes the progress record, atomically.

    Args:
        directory: the model dir.
        progress: what the sidecar has handled.
    """
    files.write_json(directory.file(files.EVAL_DIR, SIDECAR_PROGRESS_FILE), progress.to_record())



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

