"""Fault tolerance of a training run: settings (gin) and the after-loop handler.

    ctl.FaultTolerance.seed = 42                 # determinism: bit-identical resumes
    ctl.FaultTolerance.nan_policy = 'recover'
    ctl.FaultTolerance.max_recoveries = 3
    ctl.FaultTolerance.healthy_interval = 1000
    ctl.FaultTolerance.stop_check = 'loop'      # speed over the one-step bound (below)

`run_experiment` wires the pieces around one train run:

    with ModelDirLock(model_dir), SignalWatcher() as watcher:       # ctl.model_dir.trainer_lock, ctl.core.stop
      Trainer(..., stop=watcher, guard_steps=stop_check == 'step')   # the loop: ctl.core.loops.StepGuard
      (the Trainer's checkpoint also holds the Keras RNG states)    # ctl.faults.resume
      controller restores the latest checkpoint
      position the train input: read from the checkpoint, or skip   # ctl.faults.resume
      after each train loop (eager), end = FaultHandler(end):       # the loop's TrainLoopEnd
        model dir taken (a lease another trainer took)?  stop      # ctl.model_dir.trainer_lock
        bad step?  stop (NonFiniteLoss) or restore + replay:        # ctl.faults.nan_guard
                   returns the end at the restored step, so the
                   controller replays up to train_steps
        signal?    save a checkpoint, raise Preempted               # ctl.faults.preemption
      an in-line evaluation a signal ended (EvaluationStopped):
                   the same (`preempt`), its results dropped

A checkpoint is complete once the manager's `checkpoint` state file names it
(TensorFlow writes the files first and that file last, atomically), so a run
killed at any moment restarts from the latest complete checkpoint.
"""

import dataclasses
import os
from typing import Optional

import gin
import numpy as np
import tensorflow as tf

from ctl.core import checkpointing
from ctl.utils import console
from ctl.core.runner import TrainLoopEnd
from ctl.utils.errors import UserError, require_choice
from ctl.faults import resume
from ctl.model_dir.trainer_lock import ModelDirLock
from ctl.faults.nan_guard import NAN_POLICIES, NonFiniteLoss, RecoveryBudget
from ctl.core.stop import SignalWatcher
from ctl.faults.preemption import Preempted


STOP_CHECKS = ("step", "loop")


@gin.configurable(module="ctl")
@dataclasses.dataclass(frozen=True)
class FaultTolerance:
    """How a run reacts to NaN losses, and whether it is made deterministic.

    Args:
      nan_policy: 'stop' ends the run with an error naming the step whose loss
        was NaN or Inf; 'recover' restores the latest checkpoint and replays.
      max_recoveries: recoveries allowed in a row under 'recover'.
      healthy_interval: steps without a bad loss after which the count of
        recoveries starts again from zero.
      seed: if set, seeds Python, NumPy, TensorFlow and Keras and turns on TF
        op determinism before the model is built: then a run stopped and
        resumed any number of times ends with the same weights, bit for bit,
        as one that ran straight through.
      loss_upper_bound: a train loop whose mean loss is above it has a bad loss, as one with a
        NaN has (`nan_policy` decides what follows; the loop's last step names it), from step
        `loss_bound_from_step` on, as Model Garden's trainer checks its `loss_upper_bound`
        after each loop. None: no bound.
      loss_bound_from_step: the global step from which `loss_upper_bound` holds.
      stop_check: where a signal and a bad loss are looked for. 'step' (the
        default): before every step, inside the train loop (the step guard):
        a signal stops training before the next step, a NaN or Inf loss at
        its own step. 'loop': after each train loop only, for the speed of an
        unguarded loop on small models (docs/faults.md): a signal waits for
        the loop to end (at most `steps_per_loop` steps), and a NaN or Inf
        loss is found in the loop's mean loss and named by the loop's last
        step ('recover' restores and replays as with 'step'). One-process
        strategies only (default, mirrored): on a cluster the step guard is
        what makes every worker stop after the same step.
      stateless_random_ops: with `seed`, the task's train step draws from
        `tf.random.uniform`, `normal`, `truncated_normal`, `shuffle` and
        `categorical` as functions of the seed, the call, the step and the replica
        (`ctl.core.step_random`): a resume after kill -9 or SIGTERM draws what the
        uninterrupted run drew, where TensorFlow's stateful ops would start over.
        The numbers differ from the stateful ops' (Model Garden's trainer's).
    """

    nan_policy: str = "stop"
    max_recoveries: int = 3
    healthy_interval: int = 1000
    seed: Optional[int] = None
    stop_check: str = "step"
    loss_upper_bound: Optional[float] = None
    loss_bound_from_step: int = 0
    stateless_random_ops: bool = False

    @property
    def guard_steps(self) -> bool:
        """Whether the train loop looks for a signal and a bad loss before every step (the
        Trainer's `guard_steps`)."""
        return self.stop_check == "step"

    def __post_init__(self):
        require_choice("ctl.FaultTolerance.nan_policy", self.nan_policy, NAN_POLICIES)
        require_choice("ctl.FaultTolerance.stop_check", self.stop_check, STOP_CHECKS)
        for name in ("max_recoveries", "healthy_interval", "loss_bound_from_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(
                    f"ctl.FaultTolerance.{name} ({value!r}) must be a non-negative integer."
                )
        if self.loss_upper_bound is not None and (
                isinstance(self.loss_upper_bound, bool)
                or not isinstance(self.loss_upper_bound, (int, float))):
            raise UserError(f"ctl.FaultTolerance.loss_upper_bound ({self.loss_upper_bound!r}) "
                            "must be a number or None.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise UserError(f"ctl.FaultTolerance.seed ({self.seed!r}) must be an integer or None.")
        if not isinstance(self.stateless_random_ops, bool):
            raise UserError(f"ctl.FaultTolerance.stateless_random_ops "
                            f"({self.stateless_random_ops!r}) must be True or False.")
        if self.stateless_random_ops and self.seed is None:
            raise UserError("ctl.FaultTolerance.stateless_random_ops=True draws from the run's "
                            "seed, and ctl.FaultTolerance.seed is not set: set it too (any "
                            "integer), or leave stateless_random_ops False.")


class FaultHandler:
    """Runs after every train loop (eager; the controller's `after_train_loop`).

    Takes the loop's `TrainLoopEnd` and returns the one to go on from: the
    same, or after a NaN recovery the restored checkpoint's step.

    `trainer` was built with the run's stop source (`watcher`) and
    `settings.guard_steps` (`ctl.train_lib`); says at start whether the train
    input can be replayed exactly.

    Args:
        settings: the run's `ctl.FaultTolerance`.
        trainer: the run's Trainer, built with the run's stop source and `settings.guard_steps`.
        manager: the run's checkpoint manager (a recovery restores from it, a preemption saves with it).
        watcher: the run's signal watcher.
        lock: the trainer's claim on the model dir (the chief's), or None.

    Raises:
        UserError: `stop_check='loop'` on a cluster.
    """

    def __init__(self, settings: FaultTolerance, trainer, manager: checkpointing.CheckpointManager,
                 watcher: SignalWatcher, lock: Optional[ModelDirLock] = None):
        self.settings = settings
        self.lock = lock  # The trainer's claim on the model dir (the chief's).
        self.trainer = trainer
        self.manager = manager
        self.watcher = watcher
        self.guard = trainer.step_guard  # None with stop_check='loop'.
        self.budget = RecoveryBudget(settings.max_recoveries, settings.healthy_interval)
        self.per_loop = not settings.guard_steps
        parameter_servers = isinstance(trainer.strategy, tf.distribute.ParameterServerStrategy)
        multi_worker = isinstance(trainer.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if self.per_loop and (multi_worker or parameter_servers):
            name = ("ParameterServerStrategy" if parameter_servers
                    else "MultiWorkerMirroredStrategy")
            raise UserError(
                f"ctl.FaultTolerance.stop_check='loop' is for one-process strategies, not {name}: "
                "on a cluster the per-step guard makes every worker stop after the same step; "
                "leave stop_check = 'step'.")
        # Before the restore: it sets options on the train dataset.
        self.input_position = resume.InputPosition(trainer, resume.probe_pipeline(trainer.task),
                                                   seeded=settings.seed is not None)

    def resume_inputs(self) -> str:
        """Positions the train input after the restored step (call once, after restore).

        Returns how: "checkpoint" (read back), "skip" or "start".
        """
        return self.input_position.resume(self.manager.restored_path,
                                          int(self.trainer.global_step.numpy()))

    def __call__(self, end: TrainLoopEnd) -> TrainLoopEnd:
        # Before anything this loop would save: a trainer whose model dir another took stops.
        # A claim still being decided is not waited for here: the run's first write waits for
        # it (the controller's `before_writing`, `preempt`), and a bad loss does; the loop's
        # line and summaries not.
        if self.lock is not None:
            self.lock.stop_if_taken(end.step, wait=False)
        loss = (end.logs or {}).get("loss")
        above = None
        if self.per_loop and not _finite(loss):
            end = end._replace(bad_step=end.step)  # Somewhere in the loop: named by its end.
        elif end.bad_step is None and self._above_bound(loss, end.step):
            above = (float(np.mean(loss)), float(self.settings.loss_upper_bound))
            end = end._replace(bad_step=end.step)  # The loop's mean: named by its end.
        if end.bad_step is not None:
            if self.lock is not None:  # A refusal (a failed check) is the run's error first.
                self.lock.stop_if_taken(end.step)
            end = self._on_bad_loss(end.bad_step, end, above)
        # Cluster-wide, only the agreed request counts: every worker stops at the same step.
        cluster_wide = self.guard is not None and self.guard.cluster_wide
        if self.guard.stopped_by_request() if cluster_wide else self.watcher.signum is not None:
            self.preempt(end.step)
        return end

    def preempt(self, step: int) -> None:
        """Saves a checkpoint of `step` (unless there is one) and raises `Preempted`.

        After a train loop a signal ended, and after an evaluation it ended
        (`ctl.core.runner.EvaluationStopped`: its results are dropped).

        Args:
            step: the step training stopped at.
        """
        if self.lock is not None:
            self.lock.stop_if_taken(step)  # Decided, and still this trainer's, before it saves.
        path = self.manager.save(check_interval=False) or self.manager.latest_checkpoint
        self.manager.sync()  # Written (and uploaded) before the exit names it.
        if path:  # A multi-worker worker saved to its scratch dir: name the chief's copy.
            path = self.manager.restore_directory.checkpoint_path(os.path.basename(path))
        raise Preempted(self.watcher.signum, step, path)

    def _above_bound(self, loss, step: Optional[int]) -> bool:
        bound = self.settings.loss_upper_bound
        if bound is None or loss is None or step is None or not _finite(loss):
            return False
        return step >= self.settings.loss_bound_from_step and float(np.mean(loss)) > bound

    def _on_bad_loss(self, bad_step: int, end: TrainLoopEnd, above=None) -> TrainLoopEnd:
        path = self.manager.latest_checkpoint
        in_loop = self.per_loop or above is not None
        if self.settings.nan_policy == "stop":
            raise NonFiniteLoss(bad_step, "ctl.FaultTolerance.nan_policy='stop'",
                                recoverable=path is not None, in_loop_ending=in_loop, above=above)
        if path is None:
            raise NonFiniteLoss(bad_step, "nan_policy='recover', but no checkpoint was saved "
                                "before it", recoverable=False, in_loop_ending=in_loop, above=above)
        if not self.budget.spend(bad_step):
            raise NonFiniteLoss(
                bad_step, f"{self.settings.max_recoveries} recoveries already tried, the "
                f"limit set by ctl.FaultTolerance.max_recoveries", recoverable=False,
                in_loop_ending=in_loop, above=above)
        self.manager.sync()  # In an object store: uploaded, so readable where `path` says.
        with self.input_position.detached() as checkpoint:
            checkpointing.restore(checkpoint, path, self.manager.files)
        step = int(self.trainer.global_step.numpy())
        console.warning("nan", "loss is %s %s step %d: restored %s, replaying from step %d "
                        "(recovery %d of at most %d in a row).",
                        "NaN or Inf" if above is None else
                        f"{above[0]:g}, above ctl.FaultTolerance.loss_upper_bound={above[1]:g},",
                        "in the loop ending at" if in_loop else "at", bad_step, path, step,
                        self.budget.used, self.settings.max_recoveries)
        self.budget.resumed_at(step)
        if self.guard is not None:
            self.guard.clear()
        self.input_position.resume(path, step)
        return end._replace(step=step, bad_step=None, restored=path)


def _finite(loss) -> bool:
    """Whether a loop's mean loss is finite (a NaN or Inf in any step makes the mean so)."""
    return loss is None or bool(np.all(np.isfinite(loss)))
