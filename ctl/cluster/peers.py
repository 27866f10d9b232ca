"""A lost peer: a worker of the cluster died or stopped answering in the middle of training.

TensorFlow notices a lost peer and fails the collective op the survivors are in (at once when
its sockets close; after the coordination service's missed heartbeats, 10 s by default, for a
machine that vanished). `reported_as_peer_loss` turns that error into `PeerLost`, naming the
lost task(s): a task whose address refuses connections now or, when none does, one the error
names (an error that names no other task keeps its traceback). `python -m ctl.run` then exits
with `EXIT_PEER_LOST` (69): restart the cluster, which resumes from the last checkpoint.

A *frozen* ps leaves a parameter-server coordinator waiting forever; `watched` runs a
`PsWatchdog` there, which probes each ps every `PROBE_INTERVAL_S` and exits 69 for one silent
for `ANSWER_TIMEOUT_S` (the coordinator's environment variable `CTL_PS_ANSWER_TIMEOUT_S` sets
another: `answer_timeout_s`). Why and what was measured: docs/explanation/architecture.md ("Faults
on a cluster").
"""

import contextlib
import os
import re
import socket
import sys
import threading
import time
from typing import Iterator, List, Optional

import tensorflow as tf

from ctl.cluster.tf_config import ClusterConfig
from ctl.utils.errors import UserError

EXIT_PEER_LOST = 69
# The errors a collective op fails with when a peer is gone.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
               tf.errors.DeadlineExceededError, tf.errors.InternalError)
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_CAUSE = re.compile(r"aborted by|unhealthy|socket closed|heartbeat|failed to connect|connection", re.I)
_PROBE_TIMEOUT_S = 2.0
# The parameter-server watchdog: a probe op on each ps this often; no answer for
# this long and the ps is lost (docs/faults.md states the bound).
PROBE_INTERVAL_S = 5.0
ANSWER_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_ENV = "CTL_PS_ANSWER_TIMEOUT_S"  # Seconds: at least two probe intervals.


class PeerLost(Exception):
    """A task this one trains with is gone; the run cannot go on without it."""

    def __init__(self, lost: List[str], cause: str):
        """The message names the lost tasks and says how to resume.

        Args:
            lost: the lost tasks, as "worker 1 (host:port)".
            cause: how the loss showed, e.g. "TensorFlow: <its message>".
        """
        self.lost = lost
        super().__init__(
            f"lost {', '.join(lost)} ({cause}); this task stops too. Restart the "
            "lost task and this one (the same command): training resumes from the last checkpoint."
        )


def lost_tasks(cluster: ClusterConfig, message: str) -> List[str]:
    """The other training tasks that are gone, as "worker 1 (host:port)".

    Those that refuse connections now; if none does (a frozen process, a
    machine that vanished without closing its connections), those that
    `message` names (the coordination service names the tasks whose heartbeats
    stopped). A refusing task comes first because TensorFlow's messages also
    name the task that reported the failure, e.g. a worker that could not reach
    the lost ps.

    With parameter servers only a lost ps stops the coordinator
    (`ClusterCoordinator` reschedules a lost worker's steps), so when a ps is
    lost the workers are not named: a cluster manager that restarts the whole
    job after the ps died may already have stopped them.

    Args:
        cluster: the validated TF_CONFIG (`ctl.cluster.tf_config.read_tf_config`).
        message: TensorFlow's error message.
    """
    peers = [(job, index, address) for job, addresses in cluster.training_cluster().items()
             for index, address in enumerate(addresses)
             if (job, index) != (cluster.task_type, cluster.task_id)]
    refusing = [(job, index, address) for job, index, address in peers if not _listening(address)]
    named = {(job, int(index)) for job, index in _TASK.findall(message)}
    lost = refusing or [(job, index, address) for job, index, address in peers if (job, index) in named]
    lost_ps = [task for task in lost if task[0] == "ps"]
    return [f"{job} {index} ({address})" for job, index, address in lost_ps or lost]


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _cause(error: tf.errors.OpError) -> str:
    """The line of TensorFlow's message that says what happened (it also holds a traceback)."""
    lines = [line.strip() for line in str(error.message).splitlines() if line.strip()]
    for line in lines:
        if _CAUSE.search(line):
            return line[:200]
    return type(error).__name__


@contextlib.contextmanager
def reported_as_peer_loss(cluster: Optional[ClusterConfig]) -> Iterator[None]:
    """Turns a collective failure caused by a lost peer into `PeerLost` (multi-task clusters only).

    Args:
        cluster: the validated TF_CONFIG, or None (one process: nothing to turn).
    """
    if cluster is None or cluster.trainers < 2:
        yield
        return
    try:
        yield
    except PEER_ERRORS as error:
        lost = lost_tasks(cluster, str(error.message))
        if not lost:
            raise
        raise PeerLost(lost, f"TensorFlow: {_cause(error)}") from error


def answer_timeout_s() -> float:
    """How long a ps may leave the probes unanswered: `ANSWER_TIMEOUT_S`, or the environment's
    `CTL_PS_ANSWER_TIMEOUT_S` (seconds, at least two `PROBE_INTERVAL_S`: a live ps answers a
    probe every interval); a `UserError` for any other value."""
    value = os.environ.get(ANSWER_TIMEOUT_ENV)
    if value is None:
        return ANSWER_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 2 * PROBE_INTERVAL_S <= seconds < float("inf"):
        raise UserError(f"{ANSWER_TIMEOUT_ENV}={value!r} is not a number of seconds of at least "
                        f"{2 * PROBE_INTERVAL_S:.0f}; set it to one (the default is {ANSWER_TIMEOUT_S:.0f}), "
                        "or unset it")
    return seconds


class PsWatchdog:
    """Exits the coordinator with `EXIT_PEER_LOST` when a ps stops answering.

    One daemon thread per ps runs a small op on it every `PROBE_INTERVAL_S`
    and notes when it answered; a checker thread ends the process once a ps
    has not answered for `answer_timeout_s()` (read here). A probe
    that fails (a ps whose process is gone) does not count as an answer, but
    the main thread usually hears of that loss first (`reported_as_peer_loss`).

    Args:
        cluster: the validated TF_CONFIG of a parameter-server cluster (its ps tasks are watched).
    """

    def __init__(self, cluster: ClusterConfig):
        self.addresses = list(cluster.training_cluster().get("ps", []))
        self.answer_timeout_s = answer_timeout_s()
        self._answered = [time.monotonic() for _ in self.addresses]
        self._stopped = threading.Event()

    def start(self) -> "PsWatchdog":
        for index in range(len(self.addresses)):
            threading.Thread(target=self._probe_loop, args=(index,), daemon=True,
                             name=f"ctl-ps-probe-{index}").start()
        threading.Thread(target=self._check_loop, daemon=True, name="ctl-ps-watchdog").start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _probe_loop(self, index: int) -> None:
        while not self._stopped.is_set():
            try:
                _probe_ps(index)
                self._answered[index] = time.monotonic()
            except Exception:  # A ps that is gone: no answer; the checker decides.
                pass
            self._stopped.wait(PROBE_INTERVAL_S)

    def _check_loop(self) -> None:
        while not self._stopped.wait(PROBE_INTERVAL_S / 2):
            now = time.monotonic()
            silent = [index for index, answered in enumerate(self._answered)
                      if now - answered > self.answer_timeout_s]
            if silent:
                self.stop()
                lost = [f"ps {index} ({self.addresses[index]})" for index in silent]
                _exit_lost(str(PeerLost(lost, f"no answer to a probe in {self.answer_timeout_s:.0f} s: "
                                              "a frozen process or an unreachable machine")))
                return


def _probe_ps(index: int) -> None:
    """A tiny op run on ps `index` and read back (blocks while that ps does not answer)."""
    with tf.device(f"/job:ps/replica:0/task:{index}/device:CPU:0"):
        answer = tf.constant(index, tf.int32) + 1
    answer.numpy()


def _exit_lost(message: str) -> None:
    """Ends the process from the watchdog thread: the main thread is stuck inside TensorFlow."""
    print(f"ctl.run: peer lost: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_LOST)


@contextlib.contextmanager
def watched(cluster: Optional[ClusterConfig], strategy_name: str) -> Iterator[None]:
    """Runs a `PsWatchdog` while the coordinator of a parameter-server cluster trains; else nothing.

    Args:
        cluster: the validated TF_CONFIG, or None.
        strategy_name: `--strategy`: only `parameter_server` is watched.
    """
    if cluster is None or strategy_name != "parameter_server" or not cluster.is_chief \
            or not cluster.training_cluster().get("ps"):
        yield
        return
    watchdog = PsWatchdog(cluster).start()
    try:
        yield
    finally:
        watchdog.stop()
