"""`--mode=continuous_eval`: a sidecar evaluator that watches a trainer's model dir.

    python -m ctl.run --mode=continuous_eval --model_dir=DIR \\
        --gin_bindings="ctl.ContinuousEval.policy='latest'"

The loop (eager, on the host; `ctl.sidecar.scheduler.Scheduler` makes each decision):

    while True:
      present = checkpoints in DIR (NAME-N.index)     # every poll_interval
      ready = those committed; seen earlier, now gone, unhandled -> `deleted`
      decision = scheduler.decide(ready, final checkpoint if finished, present)
      EVALUATE: restore the model (validated), the hooks' on_checkpoint_load(path),
                then for each eval set
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
`save_weights` (the model is the root). Only the model (and, with
`ctl.Trainer.ema_decay`, its moving average) is read; the optimizer's values
stay unread. Restoring and evaluating one checkpoint is
`ctl.sidecar.checkpoint_evaluator.CheckpointEvaluator`'s.

The Trainer and the hooks' `Run` are built as in-line
(`ctl.core.build_run`): `run.model` is the trained model,
`run.eval_model` the evaluated one.
"""

import os
import signal
import time
from typing import Any, Dict, Optional

import tensorflow as tf

from ctl.config import gin_config as config
from ctl import model_dir as files
from ctl.utils import console
from ctl.core.checkpointing import UnreadableCheckpointError
from ctl.utils.errors import UserError
from ctl.model_dir import sidecar_progress
from ctl.model_dir.evaluator_role import SIDECAR, EvaluatorRole
from ctl.core.build_run import build_run
from ctl.core.hook_protocol import eval_callbacks
from ctl.model_dir import ModelDir, checkpoint_index
from ctl.core.stop import SignalWatcher
from ctl.sidecar import scheduler as sidecar
from ctl.sidecar.checkpoint_evaluator import CheckpointEvaluator

class Stopped(Exception):
    """The sidecar stopped on a signal, between two evaluations.

    Args:
        signum: the signal that stopped the sidecar.
        evaluations: evaluations done before it, or None.
        what: what stopped.
        unit: what `evaluations` counts.
    """

    def __init__(self, signum: int, evaluations: Optional[int] = None,
                 what: str = "the evaluator", unit: str = "evaluation(s)"):
        self.signum = signum
        done = "" if evaluations is None else f" after {evaluations} {unit}"
        super().__init__(f"{signal.Signals(signum).name} stopped {what}{done}; nothing is "
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
        settings.max_evaluations, len(progress.outcomes), sidecar_progress.progress_file(directory))
    trainer, hooks = build_run(experiment, strategy, directory, train=False, evaluate=True,
                               sidecar=True)
    evaluator = CheckpointEvaluator(trainer, hooks, experiment.schedule.eval_steps, directory)
    # The eval-side hooks (exporters, best checkpoint) run only if this process owns them
    # (`ctl.model_dir.evaluator_role`); run-end hooks such as `FinalExporter` stay with the
    # trainer, so the two never race for a file.
    role = EvaluatorRole(directory, SIDECAR, hooks.actions("on_eval_end"))
    try:
        # A trainer evaluating in-line steps aside while this sidecar holds the role.
        role.announce()
        with SignalWatcher(train=False) as signals:
            last = _watch(directory, settings, evaluator, progress, role, clock,
                          experiment.schedule.train_steps, signals)
        # The evaluations' normal end, for the hooks that take part in each (Keras callbacks'
        # on_train_end); other run-end hooks (FinalExporter) stay with the trainer.
        for hook in hooks.hooks:
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
            evaluated = [number for number, outcome in progress.outcomes.items()
                         if outcome == sidecar.EVALUATED]
            if train_steps and evaluated and max(evaluated) >= train_steps:
                # A trainer that marks nothing (Model Garden's): done once the checkpoint of the
                # last step is evaluated and none came for the timeout, as Model Garden's
                # continuous_eval ends (its timeout_fn).
                console.info("eval", "no new checkpoint for %g s after checkpoint %d (train_steps "
                             "%d reached): done", settings.timeout, max(evaluated), train_steps)
                return last
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
    evaluator.metrics.append(record)  # At once, also in an object store (`JsonLines`).
    return sidecar.EVALUATED, output


# The progress record and the metrics of the eval dir.


def load_progress(directory: ModelDir) -> sidecar.Progress:
    """The progress record, plus every evaluation `eval/metrics.jsonl` records
    (`ctl.model_dir.sidecar_progress`: how the two files are shared).

    A progress record that cannot be read is ignored (one WARNING): the
    metrics file still says which checkpoints were evaluated.

    Args:
        directory: the model dir.
    """
    record, evaluated = sidecar_progress.read_progress(directory)
    progress = sidecar.Progress.from_record(record)
    for number in evaluated:
        progress.record(number, sidecar.EVALUATED)
    return progress


def save_progress(directory: ModelDir, progress: sidecar.Progress) -> None:
    """Writes the progress record, atomically.

    Args:
        directory: the model dir.
        progress: what the sidecar has handled.
    """
    sidecar_progress.write_progress(directory, progress.to_record())
