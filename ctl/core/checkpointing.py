"""Checkpoint saving on aligned steps, and restores that refuse a different model.

`tf.train.CheckpointManager` counts its interval from the first save (steps
100, 600, 1100 for an interval of 500) and restores whatever matches, silently
leaving the rest at its initial value. ctl's manager saves when the step
crosses a multiple of the interval (500, 1000, 1500), which stays true across
restarts, and checks on restore that every variable of the model and optimizer
was found with its shape; a mismatch is a `UserError`, raised before anything
is written.
"""

import os
from typing import Optional

import tensorflow as tf

from ctl.core.errors import UserError


def interval_crossed(interval: Optional[int], last_step: Optional[int], step: int) -> bool:
    """Whether a multiple of `interval` lies in `(last_step, step]`."""
    if interval is None:
        return True
    last = 0 if last_step is None else last_step
    return step // interval > last // interval


class CheckpointManager(tf.train.CheckpointManager):
    """A `tf.train.CheckpointManager` with aligned intervals and validated restores."""

    def __init__(self, checkpoint, directory, *, step_counter, checkpoint_interval=None,
                 init_fn=None, restore_directory=None, **kwargs):
        """`restore_directory` (default: `directory`) is where restores read from:
        a multi-worker non-chief saves to a scratch directory, restores the chief's."""
        super().__init__(checkpoint, directory, step_counter=step_counter, **kwargs)
        self._restore_directory = restore_directory or directory
        self._step = step_counter
        self._interval = checkpoint_interval
        self._initialize = init_fn
        self._saved_step = _step_of(self.latest_checkpoint)
        self.last_saved_path: Optional[str] = None  # What this manager last saved.
        self.restored_path: Optional[str] = None  # What restore_or_initialize restored.

    @property
    def restore_directory(self) -> str:
        """Where restores read from: the model dir (saves may go to a worker's scratch dir)."""
        return self._restore_directory

    @property
    def checkpoint_interval(self) -> Optional[int]:
        return self._interval

    def due(self, step: int) -> bool:
        """Whether `save()` at `step` would write a checkpoint (no TensorFlow op)."""
        return step != self._saved_step and interval_crossed(self._interval, self._saved_step, step)

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        step = int(self._step.numpy())
        if step == self._saved_step or (check_interval and not self.due(step)):
            return None
        path = super().save(checkpoint_number=step, options=options)
        self._saved_step = step
        self.last_saved_path = path
        return path

    def restore_or_initialize(self) -> Optional[str]:
        path = tf.train.latest_checkpoint(self._restore_directory)
        if path is None:
            if self._initialize is not None:
                self._initialize()
            return None
        restore(self.checkpoint, path, self._restore_directory)
        self.restored_path = path
        return path


class UnreadableCheckpointError(UserError):
    """A checkpoint that is gone (deleted meanwhile) or cannot be read (corrupt, truncated)."""

    def __init__(self, message: str, deleted: bool):
        super().__init__(message)
        self.deleted = deleted


def restore(checkpoint: tf.train.Checkpoint, path: str, model_dir: str):
    """Restores `path` into `checkpoint` and returns the restore status.

    Raises `UserError` when the checkpoint holds a different model, and its
    subclass `UnreadableCheckpointError` when the files are gone or damaged.
    """
    status = None
    try:
        status = checkpoint.restore(path)
        status.assert_existing_objects_matched()
    except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as error:
        if status is not None:
            status.expect_partial()  # We report the mismatch; TensorFlow need not warn again.
        raise UserError(
            f"--model_dir={model_dir} holds a checkpoint of a different model "
            f"({os.path.basename(path)}: {_first_line(error)}); use a new --model_dir, or the config that "
            f"wrote it ({model_dir}/config.gin)."
        ) from error
    except (tf.errors.OpError, IndexError) as error:  # Gone, truncated (IndexError), corrupt.
        raise UnreadableCheckpointError(
            f"cannot read checkpoint {path} ({_first_line(error)}); remove it or use a new "
            "--model_dir.",
            deleted=isinstance(error, tf.errors.NotFoundError),
        ) from error
    return status


def _step_of(path: Optional[str]) -> Optional[int]:
    if path is None:
        return None
    suffix = path.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__
