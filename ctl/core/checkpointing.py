"""Checkpoint saving on aligned steps, and restores that refuse a different model.

Which checkpoint a restore picks when the model dir is damaged (the corruption
policy) is `ctl.model_dir.ModelDir.restore_newest`'s decision.

`tf.train.CheckpointManager` counts its interval from the first save (steps
100, 600, 1100 for an interval of 500) and restores whatever matches, silently
leaving the rest at its initial value. ctl's manager saves when the step
crosses a multiple of the interval (500, 1000, 1500), which stays true across
restarts, and checks on restore that every variable of the model and optimizer
was found with its shape; a mismatch is a `UserError`, raised before anything
is written.

In an object store (`gs://`) TensorFlow writes a checkpoint's shards to a
temporary directory and renames each, a copy and a delete there, every
request tens of milliseconds, all on the training thread. So there the
manager saves to a local staging directory (`ctl.model_dir.staging`) and hands the
upload to `ctl.model_dir.background` (its checkpoints' lanes, beside the summaries'):
the data files, then the index (beside the files of the checkpoints before), then the
`checkpoint` state file naming it, in the order saved
(after the summaries and metrics written before the save), then the deletion
of checkpoints beyond `max_to_keep` (on a lane of its own). A reader (a sidecar, a
restart) sees a checkpoint once its index is there and trusts it once the
state file names it; `sync()` waits for the uploads (not the retirements: `close()` does).

`Checkpoints` is the Controller's argument that holds a manager, with how it saves
(asynchronously or not) and who hears of a save or a restore.
"""

import dataclasses
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set

import tensorflow as tf

from ctl.core import checkpoint_contents
from ctl.utils import console
from ctl.model_dir import staging
from ctl.model_dir.background import (CHECKPOINT_FILES, CHECKPOINTS, FILES, RETIREMENTS, upload,
                                      uploads)
from ctl.utils.errors import UserError, first_line
from ctl.model_dir import (Ahead, ModelDir, Restored, UnreadableCheckpointError, checkpoint_files,
                           is_object_store)


UPLOADS_IN_FLIGHT = 3  # Object stores: saves whose upload may still be under way.


def interval_crossed(interval: Optional[int], last_step: Optional[int], step: int) -> bool:
    """Whether a multiple of `interval` lies in `(last_step, step]`.

    Args:
        interval: the interval in steps; None never crosses.
        last_step: the step of the last action (None: none yet, so only `step` counts).
        step: the current step.
    """
    if interval is None:
        return True
    last = 0 if last_step is None else last_step
    return step // interval > last // interval


class CheckpointManager:
    """Saves on aligned steps and restores by the model dir's corruption policy.

    Wraps a `tf.train.CheckpointManager` (retention, the state file), built
    at the first save: TensorFlow's reads the `checkpoint` state file when it
    is built and fails on a damaged one, and a restore must write nothing (a
    run refused later leaves the model dir as it was). When the restore had to
    skip something (`ctl.model_dir.ModelDir.restore_newest`), the state
    file is rewritten to name the restored checkpoint just before that first
    save. The interface is the subset of `tf.train.CheckpointManager`'s that
    orbit's Controller and ctl use.

    Args:
        checkpoint: the `tf.train.Checkpoint` saved and restored.
        directory: where it saves: the model dir (a multi-worker non-chief's: a scratch directory).
        step_counter: the global step variable, the number of each checkpoint.
        checkpoint_interval: steps between saves, aligned to multiples of it; None saves at every call.
        init_fn: called when a restore finds no checkpoint (the model starts fresh).
        restore_directory: where restores read from (default: `directory`; a non-chief restores the chief's).
        max_to_keep: checkpoints kept; None keeps all.
        **kwargs: other arguments of `tf.train.CheckpointManager`.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: ModelDir, *, step_counter,
                 checkpoint_interval: Optional[int] = None, init_fn=None,
                 restore_directory: Optional[ModelDir] = None, max_to_keep: Optional[int] = 5,
                 **kwargs):
        """Builds nothing yet: the `tf.train.CheckpointManager` is made at the first save."""
        self.checkpoint = checkpoint
        self.directory = directory.path  # A path, as `tf.train.CheckpointManager.directory`.
        self._step = step_counter
        self._interval = checkpoint_interval
        self._initialize = init_fn
        self._manager_kwargs = dict(kwargs, max_to_keep=max_to_keep, step_counter=step_counter)
        self._manager: Optional[tf.train.CheckpointManager] = None
        self._repair: Optional[Restored] = None  # A state file to rewrite first.
        self.latest_checkpoint: Optional[str] = None  # Restored, or saved since.
        self._files = directory  # Where it saves (a non-chief's scratch dir).
        self._restore_files = restore_directory or directory
        # The restore's first look, read from now on (in an object store beside what comes
        # before the restore: each read is a round trip); where it saves, the step last saved.
        self._first_look: Optional[Ahead] = Ahead(self._restore_files.path,
                                                  self._restore_files.first_look,
                                                  name="ctl-read-checkpoints")
        saved = (self._first_look if self._files.path == self._restore_files.path else
                 Ahead(self._files.path, self._files.first_look, name="ctl-read-saved"))
        self._saved_ahead: Optional[Ahead] = saved
        self._saved_step_value: Optional[int] = None
        self.last_saved_path: Optional[str] = None  # What this manager last saved.
        self.restored_path: Optional[str] = None  # What restore_or_initialize restored.
        # In an object store: saved here, uploaded on the uploads thread.
        self._staging: Optional[str] = None
        self._max_to_keep = max_to_keep
        # At most this many saves wait for their upload: a run that saves faster than the store
        # takes its checkpoints waits for it, as a synchronous save would, instead of queueing.
        self._uploading = threading.BoundedSemaphore(UPLOADS_IN_FLIGHT)
        self._uploaded_files: Set[str] = set()  # Staged checkpoints whose files are in the store.
        self._remote: Optional[Dict[int, str]] = None  # Uploads thread: the store's checkpoints.
        self._uploaded_at: Dict[str, float] = {}  # Uploads thread: path -> when.
        self._published: List[str] = []  # Uploads thread: what the state file names, replaced whole.

    @property
    def _saved_step(self) -> Optional[int]:
        """The step of the checkpoint last saved where it saves (the state file's, at first)."""
        if self._saved_ahead is not None:
            state, _ = self._saved_ahead.result()
            self._saved_ahead = None
            self._saved_step_value = _step_of(state.latest)
        return self._saved_step_value

    @_saved_step.setter
    def _saved_step(self, step: Optional[int]) -> None:
        self._saved_ahead = None
        self._saved_step_value = step

    @property
    def restore_directory(self) -> ModelDir:
        """Where restores read from: the model dir (saves may go to a worker's scratch dir)."""
        return self._restore_files

    @property
    def files(self) -> ModelDir:
        """Where it saves: the model dir, or a multi-worker non-chief's scratch dir."""
        return self._files

    @property
    def checkpoint_interval(self) -> Optional[int]:
        return self._interval

    @property
    def checkpoints(self) -> List[str]:
        """The checkpoints kept, oldest first; in an object store, those the bucket's state file
        names once their upload is done (`sync()` waits for it)."""
        if self._staging is not None:
            return list(self._published)
        return self._manager.checkpoints if self._manager is not None else []

    def due(self, step: int) -> bool:
        """Whether `save()` at `step` would write a checkpoint (no TensorFlow op).

        Args:
            step: the global step.
        """
        return step != self._saved_step and interval_crossed(self._interval, self._saved_step, step)

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        """Saves a checkpoint at the current step if one is due (in an object store: staged locally, uploaded in the
        background).

        Args:
            checkpoint_number: not read: the number is always the current step (kept for
                `tf.train.CheckpointManager`'s interface).
            check_interval: False saves even between intervals (a final or preemption checkpoint).
            options: `tf.train.CheckpointOptions` (`enable_async`: written on a background thread).

        Returns:
            The saved checkpoint's path, or None when nothing was saved.
        """
        step = int(self._step.numpy())
        if step == self._saved_step or (check_interval and not self.due(step)):
            return None
        if options is None or not options.enable_async:
            # An asynchronous save still writing names its checkpoint in the state file
            # when it finishes: after this save's, which it would hide.
            self.sync(uploaded=False)  # Uploads keep their order (the state file's one thread).
        if is_object_store(self.directory):
            uploads().check()  # An earlier upload failed: raise it before staging another.
        path = self._tf_manager().save(checkpoint_number=step, options=options)
        if self._staging is not None:
            self._manager.sync()  # The local files are whole before they are uploaded.
            while not self._uploading.acquire(timeout=0.5):  # Released by `_upload`.
                uploads().check()  # An upload failed meanwhile: raise it rather than wait on.
            try:
                # Its files on a lane of their own, beside the files of the checkpoints before
                # and the publication of the one before (its state file); then, in the order
                # saved, its own publication once its files and those of the checkpoints before,
                # and the summaries and metrics handed over before this save, landed.
                uploads().submit(self._upload_files, path, lane=CHECKPOINT_FILES, key=path)
                uploads().submit(self._upload, path, uploads().mark(FILES),
                                 uploads().mark(CHECKPOINT_FILES), lane=CHECKPOINTS)
            except BaseException:  # An upload failed since the check: `_upload` will not run.
                self._uploading.release()
                raise
            path = self._files.checkpoint_path(os.path.basename(path))
        self._saved_step = step
        self.latest_checkpoint = self.last_saved_path = path
        return path

    def sync(self, uploaded: bool = True) -> None:
        """Waits for an asynchronous save to finish, and in an object store (`uploaded`) for
        its upload: its files and the state file naming it, and the summaries and metrics
        handed over so far. Not for the deletes of checkpoints it retired (their own lane:
        no reader waits for a checkpoint to go; the run's end waits for them, `close`).

        Args:
            uploaded: also wait for the upload to the object store.
        """
        if self._manager is not None:
            self._manager.sync()
        if self._staging is not None and uploaded:
            uploads().wait(lanes=(FILES, CHECKPOINT_FILES, CHECKPOINTS))

    def _tf_manager(self) -> tf.train.CheckpointManager:
        if self._manager is None:
            if self._repair is not None:
                self._files.write_checkpoint_state(self._repair)
                self._repair = None
            directory, kwargs = self.directory, self._manager_kwargs
            if is_object_store(self.directory):
                directory = self._staging = staging.directory("checkpoints")
                # Retention is the upload's (in the store): a staged checkpoint stays until
                # it is uploaded, however many saves come before its turn.
                kwargs = dict(kwargs, max_to_keep=None)
            self._manager = tf.train.CheckpointManager(self.checkpoint, directory, **kwargs)
        return self._manager

    def _upload(self, local: str, files_mark: int, checkpoint_files_mark: int) -> None:
        """On the checkpoints' thread, in the order saved: once the files of the staged checkpoint
        `local` are uploaded (`_upload_files`, the first `checkpoint_files_mark` of their lane),
        and the first `files_mark` uploads of summaries and metrics are done, the state file
        naming it; then hands the retirement of checkpoints beyond `max_to_keep` to a lane of its
        own (no longer named by the state file: their deletes need not hold up the next
        checkpoint's upload)."""
        released = False
        try:
            uploads().wait_for(CHECKPOINT_FILES, checkpoint_files_mark)
            if local not in self._uploaded_files:
                return  # Its files' upload failed: that error is the run's, the state file as it was.
            self._uploaded_files.discard(local)
            self._publish(local, files_mark)
            self._uploading.release()  # Readable where the state file says: the next save may go.
            released = True
            kept = self._kept()
            retired = [self._remote.pop(n) for n in sorted(self._remote) if n not in kept]
            if retired:
                uploads().submit(self._retire, retired, lane=RETIREMENTS)
        finally:
            if not released:
                self._uploading.release()

    def _upload_files(self, local: str) -> None:
        """On the checkpoint files' thread: the files of the staged checkpoint `local`, its index
        last (a reader never finds an index without its data), then their local copies go."""
        name = os.path.basename(local)
        files = sorted((f for f in os.listdir(self._staging) if f.startswith(name + ".")),
                       key=lambda f: f.endswith(".index"))
        if not files or not files[-1].endswith(".index"):
            raise RuntimeError(f"ctl bug: the staged checkpoint {local} is not whole ({files}).")
        for file in files:
            upload(os.path.join(self._staging, file), self._files.checkpoint_path(file))
        for file in files:  # Uploaded: the local copy is not needed any more.
            os.remove(os.path.join(self._staging, file))
        self._uploaded_files.add(local)

    def _publish(self, local: str, files_mark: int) -> None:
        name = os.path.basename(local)
        if self._remote is None:  # Listed once; this thread keeps it up to date after.
            self._remote = self._files.checkpoints()
        path = self._files.checkpoint_path(name)
        self._remote[_step_of(path)] = path
        self._uploaded_at[path] = time.time()
        kept = [self._remote[n] for n in self._kept()]
        uploads().wait_for(FILES, files_mark)  # The summaries of its steps are there first.
        self._files.write_checkpoint_state(Restored(path, keep=kept), quiet=True,
                                         stamps=self._uploaded_at)
        self._published = kept

    def _kept(self):
        newest = sorted(self._remote)
        return newest[-self._max_to_keep:] if self._max_to_keep else newest

    def _retire(self, paths: List[str]) -> None:
        """Deletes the checkpoints `paths`, beyond `max_to_keep`, from the store (uploads thread).

        Each one's index goes first: a reader never finds an index without its
        data. A delete the store refuses is a warning, not the end of the run:
        the checkpoint is no longer named by the state file, and one whose index
        is left is retired again by the next run that saves there.
        """
        for path in paths:
            try:
                files = checkpoint_files(path)
                for file in sorted(files, key=lambda f: not f.endswith(".index")):
                    tf.io.gfile.remove(file)
            except tf.errors.NotFoundError:
                pass  # Deleted meanwhile: what was asked.
            except tf.errors.OpError as error:
                console.warning("ckpt", "could not delete %s, beyond max_checkpoints (%s); "
                                "the run goes on.", path, first_line(error))

    def close(self) -> None:
        """Waits for the uploads (the retirements too) and, in an object store, removes the
        staging directory (also when an upload failed)."""
        try:
            self.sync()
            if self._staging is not None:
                uploads().wait()
        finally:
            if self._staging is not None:
                staging.remove(self._staging)

    def restore_or_initialize(self) -> Optional[str]:
        """Restores the newest checkpoint that restores (reads only), or initializes."""
        first, self._first_look = self._first_look, None
        restored = self._restore_files.restore_newest(
            lambda path: restore(self.checkpoint, path, self._restore_files),
            first=first.result() if first is not None else None)
        if restored.path is None:
            if self._initialize is not None:
                self._initialize()
            return None
        if restored.state_is_stale and self._restore_files.path == self.directory:
            self._repair = restored
        self.latest_checkpoint = self.restored_path = restored.path
        self._saved_step = _step_of(restored.path)
        return restored.path


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """The Controller's checkpoints: who saves and restores them, how, and who hears of it.

    Args:
        manager: ctl's `CheckpointManager`, or another with the interface of
            `tf.train.CheckpointManager` that orbit's Controller uses: `checkpoint`,
            `directory`, `restore_or_initialize()`, `save(checkpoint_number=,
            check_interval=, options=)` (None when it did not save: it keeps its own
            interval) and `sync()`; `tf.train.CheckpointManager` itself will do. None:
            no checkpoints.
        asynchronous: saves are written on a thread (`CheckpointOptions(enable_async=True)`).
        on_end: called with a save's path once it is complete.
        on_load: called with a restored checkpoint's path.
    """

    manager: Optional[CheckpointManager] = None
    asynchronous: bool = False
    on_end: Sequence[Callable[[str], None]] = ()
    on_load: Sequence[Callable[[str], None]] = ()


def restore(checkpoint: tf.train.Checkpoint, path: str, directory: ModelDir,
            fix: Optional[str] = None):
    """Restores `path` into `checkpoint` and returns the restore status.

    Every object of `checkpoint` must get its value; values it has no object for
    (an optimizer's, for an evaluator) stay unread without TensorFlow's warnings.

    Raises `UserError` when the checkpoint of `directory` holds a different model (ending in
    `fix`, by default: a new model dir or the config that wrote it), and its
    subclass `UnreadableCheckpointError` when the files are gone or damaged.

    Args:
        checkpoint: the `tf.train.Checkpoint` restored into.
        path: the checkpoint's prefix.
        directory: the model dir it comes from (named in the errors).
        fix: the fix an error ends with (default: a new model dir, or the config that wrote it).
    """
    status = None
    try:
        status = checkpoint.restore(path)
        try:
            status.assert_existing_objects_matched()
        except AssertionError:
            if not _lacks_only_random_state(checkpoint, path):
                raise
        # Every object of this program got its value. Values it has no object for
        # (the train input's position, read by an evaluator) stay unread without
        # TensorFlow's warnings at exit.
        status.expect_partial()
    except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as error:
        if status is not None:
            status.expect_partial()  # We report the mismatch; TensorFlow need not warn again.
        raise UserError(
            f"--model_dir={directory.path} holds a checkpoint of a different model "
            f"({os.path.basename(path)}: {first_line(error)}); "
            f"{fix or f'use a new --model_dir, or the config that wrote it ({directory.config_file})'}."
        ) from error
    except (tf.errors.OpError, IndexError) as error:  # Gone, truncated (IndexError), corrupt.
        raise UnreadableCheckpointError(
            f"cannot read checkpoint {path}: {first_line(error)}",
            deleted=isinstance(error, tf.errors.NotFoundError),
        ) from error
    return status


def _lacks_only_random_state(checkpoint, path: str) -> bool:
    """Whether the checkpoint at `path` holds every variable of `checkpoint` but some of its RNG
    states (`rng`: none, written by Model Garden's trainer, Keras or a ctl before `rng`; not
    those of layers built on the model's first call, written by a ctl before it saved them);
    says so if it does.

    Those states then keep the values they have (from the seed): the run goes on from the
    checkpoint's weights, optimizer and step, and draws other dropout numbers than a run that
    never stopped.
    """
    states = getattr(checkpoint, checkpoint_contents.RNG, None)
    if not states:
        return False
    graph = checkpoint_contents.SavedGraph(tf.train.load_checkpoint(path))
    ids = {id(state) for state in states}
    missing = [variable for name, variable in
               checkpoint_contents.checkpoint_variable_paths(checkpoint).items()
               if name != "save_counter" and graph.key(graph.node(name)) is None]
    if not missing or not all(id(variable) in ids for variable in missing):
        return False
    held = "no random state" if len(missing) == len(states) else (
        f"{len(states) - len(missing)} of the model's {len(states)} random states")
    console.info("restore", "%s holds %s (its writer saved fewer): the model's %d random "
                 "generators without one start from the seed, so its dropout draws differ from "
                 "those of a run that never stopped", os.path.basename(path), held, len(missing))
    return True


def restore_model(model, model_dir: str):
    """Reads the trained weights of the newest checkpoint in `model_dir` into `model`; returns it.

        model = ctl.restore_model(my_model(), "/tmp/run")  # then model.predict(...)

    `model` is built as the run's task built it (the same function, e.g. the
    `model_fn` of `ctl.KerasModelTask`, or `MyTask().build_model()`), Keras 3
    or tf_keras, compiled or not. The weights are the trained ones (with
    `ctl.Trainer.ema_decay`, not the moving average). A damaged newest
    checkpoint is skipped as a resume skips it; a model of another shape, or
    a dir without checkpoints, is a `UserError`. Reads only.

    Args:
        model: the model, built as the run's task built it.
        model_dir: the run's model dir (a path, local or `gs://`).

    Returns:
        `model`, with the trained weights.

    Raises:
        UserError: no checkpoint in `model_dir`, or a model of another shape.
    """
    checkpoint = tf.train.Checkpoint(model=model)
    fix = "build `model` as the run's task built it (the same function and settings)"
    directory = ModelDir(model_dir)  # The entry point of a program that reads a run.
    restored = directory.restore_newest(lambda path: restore(checkpoint, path, directory, fix=fix))
    if restored.path is None:
        raise UserError(f"model_dir={model_dir!r} holds no checkpoint; name the model dir of a "
                        "run that trained (python -m ctl.run --model_dir=...).")
    return model


def _step_of(path: Optional[str]) -> Optional[int]:
    if path is None:
        return None
    suffix = path.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else None
