"""Stopping a run, in every ctl process: stop requests, SIGTERM and SIGINT, the second signal.

- `StopRequest`: a flag any hook may raise (`run.stop.request(reason)`, `ctl.core.hook_protocol`);
  the controller stops at the next boundary.
- `SignalWatcher`: SIGTERM or SIGINT as a request to stop, for the trainer (its
  loops read it in graphs, before every step: `ctl.core.loops.StepGuard`; then
  `ctl.faults.handler` saves a checkpoint and raises `Preempted`) and for the
  sidecar evaluator (it looks between two evaluations and raises `Stopped`).
  `python -m ctl.run` exits with `EXIT_PREEMPTED` after either.
- A second signal while the first is being handled ends the process at once
  with `128 + signum`, as if unhandled.
- `exit_0_on_a_late_signal`: after a finished run, a signal during the
  process's teardown ends it with status 0 and one line.

A Python signal handler only runs when the main thread comes back to the
interpreter, which a `tf.while_loop` of thousands of steps does not do. So the
watcher also hands the signal to a thread through `signal.set_wakeup_fd`:
CPython's C-level handler writes the signal number to a pipe, the thread wakes
and records it (and, for a trainer, sets the `tf.Variable`s its loops read).
The loop therefore ends within one step of the signal, whether it runs on the
host or as one `tf.while_loop`.

`EXIT_PREEMPTED` is 75 (`EX_TEMPFAIL` in `sysexits.h`: "temporary failure,
retry"), which a scheduler can tell from a failure (1) and from a user error (2).
"""

import os
import signal
import sys
import threading
from typing import Optional, Tuple

import tensorflow as tf

from ctl.utils import console

EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOPPED = -(2**62)  # `SignalWatcher.step_limit` once a stop is requested: below any loop's count.


class StopRequest:
    """A flag any hook may raise; the controller stops at the next boundary.

    Example (a hook's method):

        def on_eval_end(self, logs):
            if float(logs["accuracy"]) > 0.99:
                self.run.stop.request("accuracy above 0.99")
    """

    def __init__(self):
        self.reason: Optional[str] = None

    @property
    def should_stop(self) -> bool:
        """Whether a stop was requested: the controller reads it after each train loop and evaluation."""
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Asks the run to stop: `train_and_eval` ends after the current train loop and its
        evaluation, saves a checkpoint, closes the hooks and returns normally (exit 0).

        Args:
          reason: said in the run's log (`stop | stop requested: REASON`); the first request's
            reason is kept, later ones are ignored.
        """
        if self.reason is None:
            self.reason = reason
            console.info("stop", "stop requested: %s", reason)


class SignalWatcher:
    """Turns SIGTERM/SIGINT into a request to stop, readable in and out of graphs.

    Use as a context manager from the main thread (eager):

        with SignalWatcher() as watcher:
            ...  # loops read `watcher.step_limit` (a tf.Variable) before every step
            if watcher.signum: ...

    A trainer's watcher (`train=True`) sets two variables on a request, from
    the watcher thread: `stop_requested` (False, then True) for whoever asks
    whether to stop, and `step_limit` (0, then `STOPPED`), which
    `ctl.core.loops.StepGuard`'s loops, counting their steps up to 0, compare
    their count with: one comparison a step. It says so in one line, and that
    a second signal exits without a checkpoint. A sidecar's (`train=False`)
    makes no variable (it may be made before TensorFlow's devices are set up)
    and records the signal only: its caller says what follows.

    Outside the main thread signals cannot be caught; the watcher then does
    nothing and the default handling stays.

    Args:
        train: a trainer's watcher: it makes the `stop_requested` and `step_limit` variables and says what a signal
            does. False (a sidecar's) only records the signal.
    """

    def __init__(self, train: bool = True):
        self.train = train
        self.stop_requested = (tf.Variable(False, trainable=False, name="ctl_stop_requested")
                               if train else None)
        self.step_limit = (tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                       name="ctl_step_limit") if train else None)
        self.signum: Optional[int] = None
        self._old_handlers = {}
        self._old_wakeup_fd = -1
        self._pipe: Optional[Tuple[int, int]] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "SignalWatcher":
        if threading.current_thread() is not threading.main_thread():
            if self.train:
                console.warning("signal", "not in the main thread: SIGTERM/SIGINT end training "
                                "without a checkpoint.")
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
        """Records `signum` and asks the loops to stop (any thread); a second one exits.

        Args:
            signum: the signal's number (e.g. `signal.SIGTERM`).
        """
        name = signal.Signals(signum).name
        if self.signum is not None:
            console.warning("signal", "second %s: exiting now with status %d%s.", name,
                            128 + signum, ", without a checkpoint" if self.train else "")
            os._exit(128 + signum)
        self.signum = signum
        if not self.train:
            return
        self.stop_requested.assign(True)
        self.step_limit.assign(STOPPED)
        # Said once the loops can read it (a test waits for this line).
        console.warning("signal", "received %s: saving a checkpoint at the next step boundary, then "
                        "exiting with status %d.", name, EXIT_PREEMPTED)

    def _watch(self) -> None:
        assert self._pipe is not None  # Started by __enter__.
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


def exit_0_on_a_late_signal() -> None:
    """The run is done and its files are written: a SIGTERM or SIGINT while the
    interpreter winds TensorFlow down ends the process with status 0, in one line."""
    def finish(signum, unused_frame):
        console.info("signal", "received %s after the run ended: exiting with status 0.",
                     signal.Signals(signum).name)
        sys.stdout.flush()
        os._exit(0)

    for signum in SIGNALS:
        signal.signal(signum, finish)
