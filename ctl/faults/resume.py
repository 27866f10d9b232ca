"""Exact resume: the input position and the RNG state come back with the model.

`tf.train.Checkpoint` restores the model, optimizer and global step. Two more
things decide what a resumed run computes:

* The input position. A `DistributedIterator` cannot be checkpointed, so on
  resume ctl rebuilds the train dataset with `Task.build_inputs` and skips the
  batches already consumed: `global_step` steps of one global batch each,
  i.e. `global_step * accumulation_steps * replicas_per_pipeline` elements of
  every input pipeline.
  This works under every strategy, saves nothing, and is exact when the
  pipeline yields the same sequence each time it is built (files in a fixed
  order, `shuffle(seed=...)`, seeded random ops). Its cost: `skip` reads and
  discards those elements, so resuming late in a long epoch with an
  expensive `map` takes time. It assumes each train step calls
  `next_train_inputs` `trainer.batches_per_step` times (the Trainer does).
* RNG state. Keras 3 keeps each `SeedGenerator`'s state (Dropout, noise layers)
  in a variable that `tf.train.Checkpoint(model=...)` does not save; ctl adds
  them to the checkpoint as `rng`. Stateful random ops (`tf.random.uniform`
  without a generator, tf_keras' legacy Dropout) have no state to save.

`seed_everything` makes the computation itself repeatable: one seed for
Python, NumPy, TensorFlow and Keras, and TensorFlow op determinism.
"""

import os
import random
import tempfile
from typing import List, Optional

from absl import logging
import keras
import numpy as np
import tensorflow as tf


def seed_everything(seed: int) -> None:
    """Seeds every RNG ctl knows of and turns on TF op determinism (eager, once)."""
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def rng_state_variables(model) -> List:
    """The Keras 3 `SeedGenerator` state variables of `model`, in a stable order."""
    return [v for v in getattr(model, "variables", []) if "seed_generator_state" in getattr(v, "path", "")]


def track_rng_state(checkpoint: tf.train.Checkpoint, model) -> int:
    """Adds the model's RNG state variables to `checkpoint` as `rng`; returns how many.

    Call before the checkpoint is restored. A checkpoint written without them
    (an older ctl) no longer matches a model that has them.
    """
    states = rng_state_variables(model)
    if states:
        checkpoint.rng = states
    return len(states)


def stateful_input_op(task) -> Optional[str]:
    """Why the train pipeline's state cannot be saved (e.g. "RandomUniform is stateful"), or None.

    Builds one train pipeline and writes a checkpoint of a fresh iterator of it
    with tf.data's external-state policy FAIL (eager; the buffers are empty, so
    this is cheap). Such a pipeline is replayed by skipping, like any other,
    but its data repeat only if its random ops draw the same numbers in a new
    process.
    """
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.FAIL
    dataset = task.build_inputs(True, tf.distribute.InputContext()).with_options(options)
    with tempfile.TemporaryDirectory(prefix="ctl-input-probe-") as directory:
        try:
            tf.train.Checkpoint(iterator=iter(dataset)).write(os.path.join(directory, "probe"))
        except tf.errors.FailedPreconditionError as error:
            return str(error).split("}}")[-1].split("[Op:")[0].strip() or "a stateful op"
    return None


def warn_if_not_replayable(task, seeded: bool) -> None:
    """Says at start when a resume may not see the data an uninterrupted run would."""
    reason = stateful_input_op(task)
    if reason is None:
        return
    logging.warning(
        "the train input pipeline of %s has state ctl cannot save (%s). A resumed run "
        "rebuilds it and skips the batches already consumed; it sees the same data as an "
        "uninterrupted run only if those random ops draw the same numbers in a new process%s.",
        type(task).__name__, reason,
        "" if seeded else " (set ctl.FaultTolerance.seed, and seed tf.random.Generator objects)")


def skip_consumed_batches(trainer, steps: int) -> None:
    """Rebuilds `trainer.train_dataset` so that its next batch is the one of step `steps`.

    Runs eagerly, before the next train loop; the iterator is made anew by
    orbit's `StandardTrainer.train` (setting `train_dataset` drops the old one).
    """
    build_inputs = trainer.task.build_inputs

    batches_per_step = trainer.batches_per_step  # ctl.Trainer.accumulation_steps

    def dataset_fn(training, input_context=None):
        dataset = build_inputs(training, input_context)
        per_step = batches_per_step
        if input_context is not None:
            per_step *= input_context.num_replicas_in_sync // input_context.num_input_pipelines
        return dataset.skip(steps * per_step)

    if steps > 0:
        logging.info("train input resumes at step %d: skipping the batches already consumed", steps)
    trainer.train_dataset = trainer.distribute_dataset(dataset_fn, training=True)
