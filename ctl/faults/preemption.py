"""Graceful preemption: SIGTERM or SIGINT stops training at the next step boundary.

The signal is watched by `ctl.core.stop.SignalWatcher`, which sets the variables the train
loop reads before every step (`ctl.core.loops.StepGuard`), so the loop ends within one step
of the signal; under `MultiWorkerMirroredStrategy` the workers agree on it in the step's
all-reduce and all stop after the same step. After the loop, `ctl.faults.handler` saves a
checkpoint and raises `Preempted`; `python -m ctl.run` exits with
`ctl.core.stop.EXIT_PREEMPTED` (75, `EX_TEMPFAIL`: retry). A second signal ends the process
at once with `128 + signum`. Why not `tf.distribute.experimental.PreemptionCheckpointHandler`:
docs/explanation/fault-tolerance-internals.md.
"""

import signal
from typing import Optional


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint at `step`."""

    def __init__(self, signum: Optional[int], step: int, checkpoint: Optional[str]):
        """The message says how to resume.

        Args:
            signum: the signal received; None: another worker of the cluster received it.
            step: the step of the checkpoint.
            checkpoint: the checkpoint's path (None: none written).
        """
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name if signum else "a signal to another worker"
        super().__init__(
            f"stopped by {name} at step {step}; checkpoint {checkpoint or '(none written)'} "
            "holds every completed step. Run the same command again to resume."
        )
