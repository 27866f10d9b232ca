"""Storage faults end a run with one line, a status of their own, and nothing lost.

A full disk, a write the file system refuses, or an object store answering errors during a
save reaches `python -m ctl.run` as an `OSError` or a `tf.errors.OpError` (from Python's I/O,
TensorFlow's file systems, or an asynchronous checkpoint's writer at the next save).
`storage_fault_within` recognises them (its docstring says which) and returns a
`StorageFault` naming the path and the cause; the CLI prints its one line and exits with
`EXIT_STORAGE_FAULT` (74, `EX_IOERR`), which a scheduler can tell from a preemption (75) and
a user error (2). Nothing is repaired here and nothing needs to be: TensorFlow writes a
checkpoint's `checkpoint` state file last, so the newest complete checkpoint stays named and
intact, and once the cause is fixed the same command resumes from it (docs/faults.md).
"""

import dataclasses
import errno
import os
import re
from typing import Optional

import tensorflow as tf

from ctl.model_dir import staging
from ctl.model_dir import ModelDir

EXIT_STORAGE_FAULT = 74

_REFUSING_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM,
                    errno.EROFS, errno.EIO}
_STORAGE_OP_ERRORS = (
    tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError, tf.errors.UnavailableError,
    tf.errors.AbortedError, tf.errors.DataLossError, tf.errors.FailedPreconditionError,
    tf.errors.UnknownError, tf.errors.InternalError, tf.errors.DeadlineExceededError,
)
# The causes TensorFlow's messages carry: the C library's words, or an HTTP status.
_CAUSES = re.compile("|".join(
    [re.escape(os.strerror(code)) for code in sorted(_REFUSING_ERRNOS)]
    + [r"HTTP response code \d+", r"All \d+ retry attempts failed"]))
_TEMPSTATE = re.compile(r"\.tempstate\d+$")  # TensorFlow's suffix while it writes a file.
_NOISE = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]")


@dataclasses.dataclass(frozen=True)
class StorageFault:
    """The storage refused `path`, for `cause` (e.g. "No space left on device").

    Args:
        path: the file or directory the storage refused.
        cause: the storage's words for why (e.g. "No space left on device").
    """

    path: str
    cause: str

    def message(self, directory: ModelDir) -> str:
        """One line: what failed, and what to do, naming the newest complete checkpoint.

        Args:
            directory: the run's model dir.
        """
        newest = _newest_checkpoint(directory)
        kept = (f"the newest complete checkpoint, {newest}, is intact" if newest
                else "no checkpoint was complete yet")
        return (f"{self.path}: {self.cause}; {kept}. Fix the storage (free space, "
                f"permissions, the object store), then run the same command again to resume.")


def storage_fault_within(error: BaseException,
                         directory: Optional[ModelDir]) -> Optional[StorageFault]:
    """The storage fault behind `error` (itself, its cause or its context), or None
    (`directory`: the run's model dir, None without one).

    What counts as a storage fault:

    - an `OSError` whose errno says the storage refused: no space (ENOSPC, EDQUOT, EFBIG), no
      permission (EACCES, EPERM), a read-only file system (EROFS), an I/O error (EIO);
    - a `tf.errors.OpError` of a kind a file system or an object store raises (resource
      exhausted, permission denied, unavailable, aborted after retries, data loss, failed
      precondition, unknown, internal, deadline exceeded) whose message names a path in the
      model dir, or in the local staging root of a model dir in an object store
      (`ctl.model_dir.staging`: a full local disk there is a storage fault too). An out-of-memory
      error names no path: it keeps its traceback, as every bug does.

    Args:
        error: the error a write raised.
        directory: the run's model dir, None without one.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        fault = _as_storage_fault(error, directory)
        if fault is not None:
            return fault
        error = error.__cause__ or error.__context__
    return None


def _as_storage_fault(error: BaseException, directory: Optional[ModelDir]) -> Optional[StorageFault]:
    model_dir = directory.path if directory is not None else None
    if isinstance(error, OSError) and error.errno in _REFUSING_ERRNOS:
        return StorageFault(_named(str(error.filename or model_dir)), os.strerror(error.errno))
    if isinstance(error, _STORAGE_OP_ERRORS) and model_dir:
        text = _NOISE.sub("", str(getattr(error, "message", "") or error)).strip()
        path = _path_in(text, model_dir) or _path_in(text, staging.current_root())
        if path is None:
            return None
        causes = _CAUSES.findall(text)
        cause = causes[-1] if causes else type(error).__name__
        return StorageFault(_named(path), cause)
    return None


def _named(path: str) -> str:
    """`path`, said to be local staging if it is (a full /tmp, not the bucket)."""
    if _path_in(path, staging.current_root()) is not None:
        return f"{path} (local staging of an object-store model dir, under $TMPDIR or /tmp)"
    return path


def _path_in(text: str, directory: Optional[str]) -> Optional[str]:
    """The first path under `directory` that `text` names, or None."""
    if not directory:
        return None
    root = directory.rstrip("/")
    for token in re.split(r"[\s'\"]+", text):
        token = _TEMPSTATE.sub("", token.rstrip(";:,."))
        if token == root or token.startswith(root + "/"):
            return token
    return None


def _newest_checkpoint(directory: ModelDir) -> Optional[str]:
    """What the state file names, if the storage still answers a read."""
    try:
        return tf.train.latest_checkpoint(directory.path)
    except (OSError, tf.errors.OpError):
        return None
