"""What to do when a step's loss is NaN or Inf: the policy, without TensorFlow.

The per-step check runs in the train loop (`ctl.core.loops.StepGuard`); this module
decides, after the loop has stopped on a bad step, whether to stop the run or
to recover from the last checkpoint, and keeps count of recoveries.

    policy "stop":    raise NonFiniteLoss naming the step.
    policy "recover": restore the latest checkpoint and replay the same data,
                      at most `max_recoveries` times in a row; the count goes
                      back to zero once `healthy_interval` steps have trained
                      without a bad loss since the last recovery.
"""

from typing import Optional

from ctl.utils.errors import UserError

NAN_POLICIES = ("stop", "recover")


class NonFiniteLoss(UserError):
    """The loss was NaN or Inf at `step` and the policy says stop."""

    def __init__(self, step: int, why: str, recoverable: bool, in_loop_ending: bool = False,
                 above=None):
        """The message names the step, why, and the fix.

        Args:
            step: the bad step (with `in_loop_ending`, the step the loop ended at).
            why: why the run stops there, e.g. "ctl.FaultTolerance.nan_policy='stop'".
            recoverable: whether nan_policy='recover' would have had a checkpoint to go back to.
            in_loop_ending: the bad step is only known to be in the loop that ended at `step`
                (`ctl.FaultTolerance.stop_check='loop'`, or a loop's mean above a bound).
            above: (the loop's mean loss, `ctl.FaultTolerance.loss_upper_bound`) when the loss is
                bad for being above the bound; None: NaN or Inf.
        """
        self.step = step
        retry = (", or set ctl.FaultTolerance.nan_policy = 'recover' to restore the last "
                 "checkpoint and retry" if recoverable else "")
        where = f"in the loop ending at step {step}" if in_loop_ending else f"at step {step}"
        data = "the data of those steps" if in_loop_ending else "the data of that step"
        what = "is NaN or Inf" if above is None else (
            f"({above[0]:g}) is above ctl.FaultTolerance.loss_upper_bound ({above[1]:g}, Model "
            "Garden's trainer.loss_upper_bound)")
        super().__init__(
            f"the training loss {what} {where} ({why}); lower the learning "
            f"rate or check {data}{retry}."
        )


class RecoveryBudget:
    """Counts recoveries; `spend` says whether one more is allowed (pure logic).

    Args:
        max_recoveries: recoveries allowed in a row.
        healthy_interval: steps without a bad loss after which the count starts again from zero.
    """

    def __init__(self, max_recoveries: int, healthy_interval: int):
        self.max_recoveries = max_recoveries
        self.healthy_interval = healthy_interval
        self.used = 0
        self._healthy_since: Optional[int] = None

    def spend(self, bad_step: int) -> bool:
        """Called for a bad loss at `bad_step`; True if a recovery may run.

        Args:
            bad_step: the step whose loss was NaN or Inf.
        """
        if self._healthy_since is not None and bad_step - self._healthy_since > self.healthy_interval:
            self.used = 0
        if self.used >= self.max_recoveries:
            return False
        self.used += 1
        return True

    def resumed_at(self, step: int) -> None:
        """Training goes on from `step` (the restored checkpoint's).

        Args:
            step: the restored checkpoint's step.
        """
        self._healthy_since = step
