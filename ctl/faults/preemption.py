"""Graceful preemption: SIGTERM or SIGINT stops training at the next step boundary.

The signal is watched by `ctl.core.stop.SignalWatcher`, the one stop module of
every ctl process: it sets the variables the train loop reads before every step
(`ctl.core.loops.StepGuard`), so the loop ends within one step of the signal,
whether it runs on the host or as one `tf.while_loop`.

After the loop, `ctl.faults.handler` saves a checkpoint and raises `Preempted`;
`python -m ctl.run` exits with `ctl.core.stop.EXIT_PREEMPTED` (75, `EX_TEMPFAIL`
in `sysexits.h`: "temporary failure, retry"), which a scheduler can tell from a
failure (1) and from a user error (2). A second signal while the first is being
handled ends the process at once with `128 + signum`, as if unhandled.

After a finished run, `python -m ctl.run` exits 0, with one line, on a signal
during its teardown.

Under `MultiWorkerMirroredStrategy` the signal may reach one worker only; the
step guard agrees on it across workers in the step's all-reduce
(`ctl.core.loops.StepGuard`), so every worker stops after the same step, saves
that checkpoint together and exits 75; a worker that was not signalled says
"stopped by a signal to another worker".

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`, which also
agrees on a save step across multi-worker workers: it decides between calls of
the function it wraps (`handler.run(train_step)`), and ctl's train loop is one
call of a `tf.while_loop` over `steps_per_loop` steps, so a signal would wait
for the whole loop; it also exits the process itself. The agreed flag in the
step's all-reduce keeps the bound of one step on every strategy (BUILD.md).
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
