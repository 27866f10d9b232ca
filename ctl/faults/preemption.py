"""Graceful preemption: SIGTERM or SIGINT stops training at the next step boundary.

A Python signal handler only runs when the main thread comes back to the
interpreter, which a `tf.while_loop` of thousands of steps does not do. So
`SignalWatcher` also hands the signal to a thread through
`signal.set_wakeup_fd`: CPython's C-level handler writes the signal number to
a pipe, the thread wakes and sets a `tf.Variable` that the train loop reads
before every step (`ctl.core.loops.StepGuard`). The loop therefore ends within one step
of the signal, whether it runs on the host or as one `tf.while_loop`.

After the loop, `ctl.faults.handler` saves a checkpoint and raises `Preempted`;
`python -m ctl.run` exits with `EXIT_PREEMPTED` (75, `EX_TEMPFAIL` in
`sysexits.h`: "temporary failure, retry"), which a scheduler can tell from a
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

import os
import signal
import threading
from typing import Optional

import tensorflow as tf

from ctl.core import console

EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOPPED = -(2**62)  # `SignalWatcher.step_limit` once a stop is requested: below any loop's count.


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint at `step`."""

    def __init__(self, signum: Optional[int], step: int, checkpoint: Optional[str]):
        """`signum` None: another worker of the cluster received the signal."""
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name if signum else "a signal to another worker"
        super().__init__(
            f"stopped by {name} at step {step}; checkpoint {checkpoint or '(none written)'} "
            "holds every completed step. Run the same command again to resume."
        )


class SignalWatcher:
    """Turns SIGTERM/SIGINT into a request to stop, readable in and out of graphs.

    Use as a context manager from the main thread (eager):

        with SignalWatcher() as watcher:
            ...  # loops read `watcher.step_limit` (a tf.Variable) before every step
            if watcher.signum: ...

A request sets two variables, from the watcher thread: `stop_requested`
(False, then True) for whoever asks whether to stop, and `step_limit` (0,
then `STOPPED`), which `ctl.core.loops.StepGuard`'s loops, counting
their steps up to 0, compare their count with: one comparison a step.

    Outside the main thread signals cannot be caught; the watcher then does
    nothing and the default handling stays.
    """

    def __init__(self):
        self.stop_requested = tf.Variable(False, trainable=False, name="ctl_stop_requested")
        self.step_limit = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                      name="ctl_step_limit")
        self.signum: Optional[int] = None
        self._old_handlers = {}
        self._old_wakeup_fd = -1
        self._pipe = None
        self._thread = None

    def __enter__(self) -> "SignalWatcher":
        if threading.current_thread() is not threading.main_thread():
            console.warning("signal", "not in the main thread: SIGTERM/SIGINT end training without a checkpoint.")
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        for signum in SIGNALS:
            self._old_handlers[signum] = signal.signal(signum, self._on_signal_in_main_thread)
        self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="ctl-signal-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        read_fd, write_fd = self._pipe
        os.close(write_fd)  # Ends the watcher thread's read.
        self._thread.join(timeout=5)
        os.close(read_fd)
        self._pipe = None

    def requested(self) -> bool:
        """Whether a signal came (eager, any thread; a Python read)."""
        return self.signum is not None

    def request_stop(self, signum: int) -> None:
        """Records `signum` and asks the train loop to stop (any thread)."""
        name = signal.Signals(signum).name
        if self.signum is not None:
            console.warning("signal", "second %s: exiting now with status %d, without a checkpoint.",
                            name, 128 + signum)
            os._exit(128 + signum)
        self.signum = signum
        self.stop_requested.assign(True)
        self.step_limit.assign(STOPPED)
        # Said once the loops can read it (a test waits for this line).
        console.warning("signal", "received %s: saving a checkpoint at the next step boundary, then "
                        "exiting with status %d.", signal.Signals(signum).name, EXIT_PREEMPTED)

    def _watch(self) -> None:
        read_fd = self._pipe[0]
        while True:
            try:
                data = os.read(read_fd, 16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in SIGNALS:
                    self.request_stop(signum)

    def _on_signal_in_main_thread(self, signum, frame) -> None:
        # The watcher thread already acted on the byte CPython wrote to the pipe;
        # this handler exists so that SIGINT does not raise KeyboardInterrupt.
        del signum, frame
