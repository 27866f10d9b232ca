"""Exact resume: the input position and the RNG state come back with the model.

- `InputPosition`: the train iterator in the checkpoint (`train_input`) where TensorFlow can
  save it (the default strategy); elsewhere the train dataset is rebuilt and the batches
  already consumed are skipped (`skip_consumed_batches`);
- the Keras 3 RNG states (Dropout, noise layers), in the checkpoint as `rng`
  (`ctl.core.checkpoint_contents`);
- `seed_everything`: one seed for Python, NumPy, TensorFlow and Keras, and TF op determinism
  (and, on a CPU, a line saying what op determinism leaves to chance: `cpu_left_to_chance`);
- `stateful_input_op`, `say_not_replayable`: a pipeline whose state cannot be saved, said
  before its first step (probed beside the restore and the train step's trace).

What comes back on which strategy, and what it costs: docs/faults.md ("Resume") and
docs/explanation/fault-tolerance-internals.md.
"""

import contextlib
import os
import platform
import random
import sys
import tempfile
import threading
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from ctl.utils import console
from ctl.core import contract
from ctl.utils.errors import first_line
from ctl.faults import run_size


def seed_everything(seed: int) -> None:
    """Seeds every RNG ctl knows of and turns on TF op determinism (eager, once).

    With tf_keras loaded (Model Garden's Keras), its layers built from now on draw from
    `tf.random.Generator`s (`tf_keras.backend.experimental.enable_tf_random_generator`), whose
    states the checkpoint holds (`rng`): tf_keras' default random ops keep theirs in the
    process only, so a resumed run's dropout would draw other masks.

    On a CPU, op determinism does not make every kernel repeat bit for bit: where they may not
    (`cpu_left_to_chance`), says so once per process, with the fix (`CPU_NOTE`).

    Args:
        seed: `ctl.FaultTolerance.seed`.
    """
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    keras.utils.set_random_seed(seed)
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:  # Model Garden's Keras: its dropout draws from generators ctl saves.
        tf_keras.utils.set_random_seed(seed)
        tf_keras.backend.experimental.enable_tf_random_generator()
    tf.config.experimental.enable_op_determinism()
    if not _said_cpu_note and not tf.config.list_physical_devices("GPU") and cpu_left_to_chance():
        _said_cpu_note.append(True)
        console.info("setup", CPU_NOTE)


def cpu_left_to_chance() -> bool:
    """Whether TensorFlow's CPU kernels may give other bits for the same inputs in this process:
    they run beside other ops (inter-op parallelism, `TF_NUM_INTEROP_THREADS` not 1) or through
    oneDNN (`TF_ENABLE_ONEDNN_OPTS`). Op determinism covers neither.

    Measured on Model Garden's DeepLab, its own train step with no ctl code (`python -m
    bench.model_garden_zoo.guarantees seg_deeplabv3_pascal --gradients`): its gradients on one
    batch differ between calls with ops side by side, with oneDNN's kernels or without; and a
    restarted run's weights by a few ulps with oneDNN's kernels even one op at a time.
    """
    one_at_a_time = (tf.config.threading.get_inter_op_parallelism_threads() == 1
                     or os.environ.get("TF_NUM_INTEROP_THREADS") == "1")
    return onednn_on() or not one_at_a_time


def onednn_on() -> bool:
    """Whether TensorFlow's CPU kernels go through oneDNN in this process: its Linux x86 builds
    do unless `TF_ENABLE_ONEDNN_OPTS` turns them off (read as TensorFlow is imported, and said in
    its "oneDNN custom operations are on" line)."""
    value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if value is not None:
        return value.strip().lower() in ("1", "true")
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


CPU_NOTE = ("op determinism leaves TensorFlow's CPU kernels free to add in another order when "
            "other ops run beside them and, through oneDNN (TF_ENABLE_ONEDNN_OPTS), from one "
            "process to the next: a resumed run may end a few ulps away from an uninterrupted "
            "one; for bit for bit, start the process with TF_NUM_INTEROP_THREADS=1 "
            "TF_ENABLE_ONEDNN_OPTS=0 (slower; a few models still vary from one process to the "
            "next: docs/faults.md)")
_said_cpu_note: list = []  # Once per process.


def probe_pipeline(task) -> tf.data.Dataset:
    """A train pipeline of `task` as the default strategy builds it, for the probes below.

    Its own pipeline, not the trainer's: iterators of one dataset share its
    shuffle's seed generator, so probing the trainer's would change its data.

    Args:
        task: the run's `ctl.Task`.
    """
    return contract.inputs(task, True, tf.distribute.InputContext())


def stateful_input_op(task, probe: Optional[tf.data.Dataset] = None) -> Optional[str]:
    """Why the train pipeline's state cannot be saved (e.g. "RandomUniform is stateful"), or None.

    Writes a checkpoint of a fresh iterator of `probe` (default: a new
    `probe_pipeline(task)`) with tf.data's external-state policy FAIL (eager;
    the buffers are empty, so this is cheap). Such a pipeline's position is
    saved or skipped to like any other's, but its data repeat only if its
    random ops draw the same numbers in a new process.

    Args:
        task: the run's `ctl.Task`.
        probe: a train pipeline of it (None: `probe_pipeline(task)`).
    """
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.FAIL
    probe = probe_pipeline(task) if probe is None else probe
    error = _serialization_error(probe.with_options(options), started=False)
    return None if error is None or "stateful" not in error else error


def say_not_replayable(task, seeded: bool, reason: Optional[str]) -> None:
    """Says how a resume repeats the data of a train pipeline with state ctl cannot save
    (`reason`, from `stateful_input_op`; None: nothing to say).

    Seeded (`ctl.FaultTolerance.seed`), its random ops draw the same numbers in a new process
    from their start: a resume reads the consumed batches again (`InputPosition`'s replay)
    rather than restoring an iterator whose ops would start over. Unseeded, a WARNING says that
    its data do not repeat.

    Args:
        task: the run's `ctl.Task`.
        seeded: whether `ctl.FaultTolerance.seed` is set.
        reason: the state a checkpoint cannot hold, or None.
    """
    if reason is None:
        return
    if seeded:
        console.info(
            "input", "the train input pipeline of %s has state a checkpoint cannot hold (%s): a "
            "resume reads the batches already consumed again, so that its seeded random ops draw "
            "what an uninterrupted run's draw.", type(task).__name__, reason)
    else:
        console.warning(
            "input", "the train input pipeline of %s has state ctl cannot save (%s). A resumed run "
            "does not see the data an uninterrupted run would (set ctl.FaultTolerance.seed: a "
            "resume then reads the consumed batches again; seed tf.random.Generator objects).",
            type(task).__name__, reason)


def saving_options() -> tf.data.Options:
    """The tf.data options under which ctl saves a train iterator: its full state, not tf.data's
    symbolic checkpoints (those make a `shuffle` many times slower per batch in TensorFlow 2.20,
    measured on digits, for a smaller checkpoint without prefetch buffers), and stateful random
    ops' draws left out (`say_not_replayable` says so). They change nothing but what an
    iterator's checkpoint holds."""
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = False
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


class _Probes:
    """Whether a train pipeline has state a checkpoint cannot hold (`stateful_input_op`) and
    whether a started iterator of it can be saved, found on a thread of its own: they make
    iterators of the probe pipeline and write them (work TensorFlow does outside Python), beside
    the restore and the train step's trace. Builds nothing: no op takes a seed meanwhile.

    Args:
        task: the run's `ctl.Task`.
        probe: a train pipeline of it (`probe_pipeline`).
        seeded: whether `ctl.FaultTolerance.seed` is set (a stateful pipeline is then replayed,
            and its started iterator is not tried).
        try_saving: whether to try a started iterator (the train dataset is a `tf.data.Dataset`).
    """

    def __init__(self, task, probe: tf.data.Dataset, seeded: bool, try_saving: bool):
        self.stateful: Optional[str] = None  # Why its state cannot be saved, or None.
        self.unsaved: Optional[str] = None  # Why a started iterator cannot be written, or None.
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(task, probe, seeded, try_saving),
                         name="ctl-input-probes", daemon=True).start()

    def _run(self, task, probe, seeded: bool, try_saving: bool) -> None:
        try:
            self.stateful = stateful_input_op(task, probe)
            if try_saving and not (seeded and self.stateful is not None):
                # An iterator that has produced one element: some ops refuse only once they
                # run (`from_generator`).
                self.unsaved = _serialization_error(probe.with_options(saving_options()),
                                                    started=True)
        except BaseException as error:  # Raised where the result is read.
            self._error = error
        finally:
            self._done.set()

    def result(self) -> "_Probes":
        """Waits for the probes; raises what they raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self


TRAIN_INPUT = "train_input"  # The train iterator's name in the checkpoint.


class InputPosition:
    """The train input's position: in the checkpoint where TensorFlow can save it, else skipped to.

    Built before the checkpoint is restored (it may replace
    `trainer.train_dataset` by the same dataset with tf.data options set).
    Restores of `trainer.checkpoint` happen with the position detached
    (`detached()`); `resume(path, step)` then positions the input and attaches
    the iterator to the checkpoint for the saves that follow.
    """

    def __init__(self, trainer, probe: Optional[tf.data.Dataset] = None, seeded: bool = False):
        """Sets the train dataset's options and sizes the run; probes the pipeline beside.

        Args:
            trainer: the run's Trainer (its train dataset, checkpoint and strategy).
            probe: a train pipeline of the trainer's task (`probe_pipeline`) to try options on
                (None: one is built).
            seeded: whether `ctl.FaultTolerance.seed` is set: a pipeline whose seeded random ops
                an iterator's state leaves out (they would start over at a saved position) is
                then resumed by reading the consumed batches from a fresh pipeline.
        """
        self.trainer = trainer
        self.seeded = seeded
        probe = probe_pipeline(trainer.task) if probe is None else probe
        dataset = trainer.train_dataset
        self._tf_data = isinstance(dataset, tf.data.Dataset)
        if self._tf_data:  # Before its iterator is made; whether it saves is found beside.
            trainer.train_dataset = dataset.with_options(saving_options())
        self._probes: Optional[_Probes] = _Probes(trainer.task, probe, seeded, self._tf_data)
        self._replay = False
        self._options: Optional[tf.data.Options] = None  # Under which the iterator saves, if it does.
        self._why_not_saved: Optional[str] = None
        self.how: Optional[str] = None  # How the last resume found the position: "checkpoint", "skip" or "start".
        # Examples consumed, for a restart at another size (None under parameter servers).
        self.size = run_size.input_size(trainer.strategy, trainer.checked_inputs, probe)
        self.examples = run_size.ExamplesRecord() if self.size is not None else None

    def _decided(self) -> None:
        """Reads the probes once they are known (once), and says what they found."""
        if self._probes is None:
            return
        probes, self._probes = self._probes.result(), None
        say_not_replayable(self.trainer.task, self.seeded, probes.stateful)
        self._replay = self.seeded and probes.stateful is not None
        if self._replay:
            self._why_not_saved = ("its random ops' state is not an iterator's: the consumed "
                                   "batches are read again")
        elif not self._tf_data:
            self._why_not_saved = (f"the train dataset is a {type(self.trainer.train_dataset).__name__}, "
                                   "whose iterator TensorFlow cannot checkpoint")
        elif probes.unsaved is not None:
            self._why_not_saved = probes.unsaved
        else:
            self._options = saving_options()

    @property
    def replay(self) -> bool:
        """Whether a resume reads the consumed batches again from a fresh pipeline (a seeded
        pipeline with state an iterator's checkpoint leaves out)."""
        self._decided()
        return self._replay

    @property
    def why_not_saved(self) -> Optional[str]:
        """Why checkpoints do not hold the train iterator's state, or None."""
        self._decided()
        return self._why_not_saved

    @property
    def saved(self) -> bool:
        """Whether checkpoints hold the train iterator's state (`train_input`)."""
        self._decided()
        return self._options is not None

    def with_options(self, dataset):
        """`dataset` with the tf.data options under which its iterator saves (itself if it does not).

        Args:
            dataset: the train dataset.
        """
        return dataset.with_options(self._options) if self._options is not None else dataset

    @contextlib.contextmanager
    def detached(self):
        """The trainer's checkpoint without `train_input`, for restoring any checkpoint."""
        checkpoint = self.trainer.checkpoint
        attached = [name for name in (TRAIN_INPUT, run_size.TRAIN_EXAMPLES) if hasattr(checkpoint, name)]
        for name in attached:
            delattr(checkpoint, name)
        try:
            yield checkpoint
        finally:
            if attached:
                self._attach()

    def _attach(self) -> None:
        if self.saved:
            setattr(self.trainer.checkpoint, TRAIN_INPUT, self.trainer.train_iterator)
        if self.examples is not None:
            setattr(self.trainer.checkpoint, run_size.TRAIN_EXAMPLES, self.examples.variable)

    def resume(self, path: Optional[str], step: int) -> str:
        """Positions the train input after `step`, restored from `path` (None: a fresh start).

        Reads the saved position when `path` has one for this pipeline, else
        skips the consumed batches. Returns how: "checkpoint", "skip" or "start".

        Args:
            path: the restored checkpoint (None: a fresh start).
            step: the restored step.
        """
        segment = run_size.recorded(path) if path is not None and self.size else None
        if segment is not None and segment.size != self.size and self.size.global_batch is not None:
            examples = segment.examples_at(step)
            self._skip_examples(path, step, examples, segment.size)
            segment = run_size.Segment(examples, step, self.size)
            self.how = "skip"
        elif path is not None and self.saved and self._read(path):
            self.how = "checkpoint"
        elif step > 0 and self.saved:
            # Read and dropped from the iterator, not `skip`ped in the dataset: the
            # pipeline keeps the structure of a fresh one, whose positions later saves hold.
            console.info("input", "train input resumes at step %d: reading the batches already "
                         "consumed", step)
            _advance(self.trainer.train_iterator, tf.constant(step, tf.int64))
            self.how = "skip"
        elif step > 0 and self.replay:
            # Through the map functions: their random ops draw what they drew before.
            console.info("input", "train input resumes at step %d: reading the batches already "
                         "consumed", step)
            _advance(self.trainer.train_iterator,
                     tf.constant(step * self.trainer.batches_per_step, tf.int64))
            self.how = "skip"
        elif step > 0:
            skip_consumed_batches(self.trainer, step)
            self.how = "skip"
        else:
            self.how = "start"
        self._attach()
        if self.examples is not None:  # After attaching: a deferred restore would overwrite it.
            # No record (a fresh run, an older checkpoint): read at this size from the start.
            self.examples.set(segment or run_size.Segment(0, 0, self.size))
        return self.how

    def _skip_examples(self, path: str, step: int, examples: int, written_by: run_size.InputSize):
        """Resumes after `examples` examples at this run's size, which is not the checkpoint's."""
        elements, again = run_size.elements_to_skip(examples, self.size)
        console.warning(
            "input", "resuming %s at a new size: it was written by a run of %s, this one has %s. Training "
            "goes on from step %d after the %d examples consumed%s, but is no longer bit-identical "
            "to an uninterrupted run (other shards and batches, reductions in another order).",
            path, written_by, self.size, step, examples,
            f" ({again} of them are read again: not a whole batch of each input pipeline)" if again else "")
        if self.saved:
            _advance(self.trainer.train_iterator, tf.constant(elements, tf.int64))
        else:
            _skip_elements(self.trainer, lambda unused_context: elements)

    def _read(self, path: str) -> bool:
        if not _has_position(path):
            console.info("input", "%s holds no train input position: skipping the consumed "
                         "batches", path)
            return False
        iterator = self.trainer.train_iterator
        try:
            tf.train.Checkpoint(**{TRAIN_INPUT: iterator}).read(path).expect_partial()
        except (tf.errors.OpError, ValueError, AssertionError) as error:
            console.warning(
                "input", "the train input position in %s does not fit this input pipeline (%s): "
                "skipping the consumed batches instead", path, first_line(error, 200))
            self.trainer.train_dataset = self.with_options(self.trainer.train_dataset)  # Anew.
            return False
        return True


@tf.function
def _advance(iterator, count):
    for _ in tf.range(count):
        next(iterator)


def _has_position(path: str) -> bool:
    prefix = TRAIN_INPUT + "/"
    return any(name.startswith(prefix) for name, _ in tf.train.list_variables(path))


def _serialization_error(dataset, started: bool) -> Optional[str]:
    """Why the state of an iterator of `dataset` (`started`: after one element) cannot be
    written, or None. Writes it to a scratch dir."""
    iterator = iter(dataset)
    with tempfile.TemporaryDirectory(prefix="ctl-input-probe-") as directory:
        try:
            if started:
                next(iterator, None)
            tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, "probe"))
        except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError) as error:
            return str(error).split("}}")[-1].split("[Op:")[0].strip() or type(error).__name__
    return None


def skip_consumed_batches(trainer, steps: int) -> None:
    """Rebuilds `trainer.train_dataset` so that its next batch is the one of step `steps`.

    Runs eagerly, before the next train loop; the trainer makes a new
    iterator when its `train_dataset` is replaced.

    Args:
        trainer: the run's Trainer.
        steps: the steps already trained (their batches are skipped).
    """
    batches_per_step = trainer.batches_per_step  # ctl.Trainer.accumulation_steps

    def elements(input_context):
        per_step = batches_per_step
        if input_context is not None:
            per_step *= input_context.num_replicas_in_sync // input_context.num_input_pipelines
        return steps * per_step

    if steps > 0:
        console.info("input", "train input resumes at step %d: skipping the batches already "
                     "consumed", steps)
    _skip_elements(trainer, elements)


def _skip_elements(trainer, elements) -> None:
    """Rebuilds `trainer.train_dataset` with `elements(input_context)` elements of each pipeline skipped."""
    build_inputs = trainer.checked_inputs

    def dataset_fn(training, input_context=None):
        return build_inputs(training, input_context).skip(elements(input_context))

    trainer.train_dataset = trainer.distribute_dataset(dataset_fn, training=True)
