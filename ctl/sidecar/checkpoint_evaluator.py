"""`CheckpointEvaluator`: the sidecar's evaluation of one checkpoint (eager, on the host).

It restores a checkpoint into the sidecar's Trainer (validated: a checkpoint of
another model is a `UserError`), calls the hooks' `on_checkpoint_load`, runs the
Trainer's own evaluation of every eval set, and writes its summaries at the
checkpoint's global step. Three checkpoint layouts restore: ctl's and
`tf.train.Checkpoint(model=..., optimizer=...)` (a `model` object at the root), and
tf_keras' `save_weights` (the model is the root); only the model (and, with
`ctl.Trainer.ema_decay`, its moving average) is read. A checkpoint in an object store
is copied to a local directory first. What cannot be read raises
`UnreadableCheckpointError`: `ctl.sidecar.continuous_eval` records it and goes on.
"""

import logging as std_logging
import os
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from ctl.model_dir import staging
from ctl.model_dir.background import uploads
from ctl.core.checkpoint_contents import MODEL, SavedGraph, saved_step
from ctl.core.checkpointing import UnreadableCheckpointError, restore
from ctl.utils.errors import first_line
from ctl.core.hook_protocol import Hooks
from ctl.model_dir import JsonLines, ModelDir, checkpoint_files, is_object_store
from ctl.core.summaries import SummaryManager


class CheckpointEvaluator:
    """Restores checkpoints into a Trainer's model and runs its evaluation (eager).

    Args:
      trainer: the sidecar's Trainer (`build_run`); its own evaluation runs every
        eval set and the hooks' Keras callbacks, as in-line (`Trainer.evaluate`).
      hooks: the experiment's hooks, bound to it: their `on_checkpoint_load` follows each restore.
      eval_steps: `ctl.Schedule.eval_steps` (None: each eval set to its end).
      directory: the model dir it evaluates.
    """

    def __init__(self, trainer, hooks: Hooks, eval_steps: Optional[int], directory: ModelDir):
        self.trainer = trainer
        self.hooks = hooks
        self.model = self.trainer.eval_model  # The moving average, with ctl.Trainer.ema_decay.
        self.eval_steps = eval_steps or -1
        self.directory = directory
        self.eval_dir = directory.eval_dir
        # Each evaluation's record, in the store before its progress record (`background=False`).
        self.metrics = JsonLines(directory.sidecar_metrics_file, background=False)
        self._summaries: Optional[SummaryManager] = None
        tf.get_logger().addFilter(_PartialRestoreNotice())

    def evaluate(self, number: int, path: str) -> Dict[str, Any]:
        """Restores `path` and evaluates it; raises `UnreadableCheckpointError`/`UserError`.

        Args:
            number: the checkpoint's number (its step).
            path: the checkpoint's prefix.
        """
        step = self._restore(number, path)
        self.hooks.call("on_checkpoint_load", path)  # As a trainer's resume calls it.
        results = self.trainer.evaluate(self.eval_steps)
        return {"step": step, "results": _to_python(results)}

    def _restore(self, number: int, path: str) -> int:
        if not is_object_store(path):
            return self._restore_from(number, path, path)
        # In an object store each read of the restore is a request: one copy of the files
        # to a local dir first (faster at an object store's latency: bench figure 9, bench/README.md).
        local = staging.directory("restore")
        try:
            try:
                remotes = checkpoint_files(path)
            except tf.errors.OpError as error:
                raise _unreadable(path, error) from error
            for remote in remotes:
                _download(remote, os.path.join(local, os.path.basename(remote)), path)
            return self._restore_from(number, path, os.path.join(local, os.path.basename(path)))
        finally:
            staging.remove(local)

    def _restore_from(self, number: int, path: str, readable: str) -> int:
        """Restores checkpoint `path`, read at `readable` (the same, or a local copy)."""
        try:
            reader = tf.train.load_checkpoint(readable)
            graph = SavedGraph(reader)
            step = saved_step(reader, graph, self.trainer.optimizer)
        except (tf.errors.OpError, IndexError, ValueError) as error:
            raise UnreadableCheckpointError(
                f"cannot read checkpoint {path} ({first_line(error)})",
                deleted=isinstance(error, tf.errors.NotFoundError),
            ) from error
        if step is None:
            step = number
        if MODEL in graph.root_children():  # ctl, tf.train.CheckpointManager
            checkpoint = tf.train.Checkpoint(**self.trainer.eval_restore_objects())
        else:
            checkpoint = tf.train.Checkpoint(root=self.model)  # tf_keras save_weights
        # The optimizer's values stay unread (restore allows it).
        restore(_ReadOnly(checkpoint), readable, self.directory, fix=(
            "evaluate it with the trainer's config: its --gin_file and --gin_bindings, or "
            f"neither to read {self.directory.config_file}, if the trainer wrote the checkpoint"))
        self.trainer.global_step.assign(step)
        return step

    def write_summaries(self, results: Dict[str, Any]) -> None:
        """Summaries at the restored global step; one subdirectory per named eval set.

        Args:
            results: the evaluation's results, nested by eval set with named sets.
        """
        if self._summaries is None:
            self._summaries = SummaryManager(self.eval_dir, self.trainer.global_step)
        self._summaries.write_summaries(results)
        self._summaries.flush()
        uploads().wait()  # In the store before the evaluation's record (object stores).

    def close(self) -> None:
        """Closes the metrics file; removes the summaries' staging dir (object stores)."""
        self.metrics.close()
        if self._summaries is not None:
            self._summaries.close()


_CHUNK_BYTES = 16 << 20


def _download(remote: str, local: str, path: str) -> None:
    """Copies `remote`, a file of checkpoint `path` in an object store, to the local file `local`.

    A read the store refuses is the checkpoint's: `UnreadableCheckpointError`
    (recorded, never evaluated). A write the local disk refuses (no space) is
    the disk's: its `OSError`, naming `local`, ends the sidecar as a storage
    fault (`python -m ctl.run`: one line, exit 74), and a restart evaluates it.
    """
    try:
        with open(local, "wb") as target:
            for chunk in _chunks(remote, path):
                target.write(chunk)
    except OSError as error:
        if error.filename is None:  # A failed write names no file.
            raise OSError(error.errno, error.strerror, local) from error
        raise


def _chunks(remote: str, path: str):
    try:
        with tf.io.gfile.GFile(remote, "rb") as source:
            while True:
                chunk = source.read(_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
    except tf.errors.OpError as error:
        raise _unreadable(path, error) from error


def _unreadable(path: str, error: tf.errors.OpError) -> UnreadableCheckpointError:
    return UnreadableCheckpointError(f"cannot read checkpoint {path} ({first_line(error)})",
                                     deleted=isinstance(error, tf.errors.NotFoundError))


class _PartialRestoreNotice(std_logging.Filter):
    """Drops TensorFlow's notices, when a checkpoint object is collected, about values
    it did not restore: the evaluator reads only the model, and reports a failed read
    itself, once."""

    def filter(self, record):
        message = record.getMessage()
        return not message.startswith((
            "Detecting that an object or model or tf.train.Checkpoint is being deleted",
            "Value in checkpoint could not be found in the restored object"))


class _ReadOnly:
    """`checkpoint.read` in place of `restore`: no `save_counter` to match (files
    written by `Model.save_weights` have none)."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        self._checkpoint = checkpoint

    def restore(self, path: str):
        return self._checkpoint.read(path)


def _to_python(value):
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()
