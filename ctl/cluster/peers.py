"""A lost peer: a worker of the cluster died or stopped answering in the middle of training.

Under `MultiWorkerMirroredStrategy` every step is an all-reduce over all
workers, so when one worker is killed (SIGKILL, OOM killer, a lost machine)
the others cannot go on. TensorFlow's runtime notices and fails the collective
op the survivors are in:

  * at once when the peer's process is gone and its sockets are closed
    ("Socket closed" from `/job:worker/replica:0/task:1`);
  * otherwise (a machine that vanished, a frozen process) when the
    coordination service misses the peer's heartbeats, 10 s by default
    ("The following tasks are unhealthy (stopped sending heartbeats)").

The error reaches the survivor's main thread as a `tf.errors.OpError` from the
train loop (or from a save or an evaluation). `reported_as_peer_loss` turns it
into `PeerLost`, whose message names the lost task(s), and `python -m ctl.run`
exits with `EXIT_PEER_LOST` (69, `EX_UNAVAILABLE` in `sysexits.h`): restart
the cluster, which resumes from the last checkpoint.

A task is named lost if its address refuses connections now or, when none
does, if the error names it (`/job:worker/replica:0/task:1`). An error that
names no other task, with every peer still listening, is not a peer loss and
keeps its traceback.
"""

import contextlib
import re
import socket
from typing import Iterator, List, Optional

import tensorflow as tf

from ctl.cluster.tf_config import ClusterConfig

EXIT_PEER_LOST = 69
# The errors a collective op fails with when a peer is gone.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
               tf.errors.DeadlineExceededError, tf.errors.InternalError)
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_CAUSE = re.compile(r"aborted by|unhealthy|socket closed|heartbeat|failed to connect|connection", re.I)
_PROBE_TIMEOUT_S = 2.0


class PeerLost(Exception):
    """A task this one trains with is gone; the run cannot go on without it."""

    def __init__(self, lost: List[str], cause: str):
        self.lost = lost
        super().__init__(
            f"lost {', '.join(lost)} (TensorFlow: {cause}); this task stops too. Restart the "
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
    """
    peers = [(job, index, address) for job, addresses in cluster.training_cluster().items()
             for index, address in enumerate(addresses)
             if (job, index) != (cluster.task_type, cluster.task_id)]
    refusing = [(job, index, address) for job, index, address in peers if not _listening(address)]
    named = {(job, int(index)) for job, index in _TASK.findall(message)}
    lost = refusing or [(job, index, address) for job, index, address in peers if (job, index) in named]
    return [f"{job} {index} ({address})" for job, index, address in lost]


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
    """Turns a collective failure caused by a lost peer into `PeerLost` (multi-task clusters only)."""
    if cluster is None or cluster.trainers < 2:
        yield
        return
    try:
        yield
    except PEER_ERRORS as error:
        lost = lost_tasks(cluster, str(error.message))
        if not lost:
            raise
        raise PeerLost(lost, _cause(error)) from error
