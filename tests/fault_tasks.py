"""A regression task for fault tests: shuffled data, Keras 3 dropout, NaN injection, progress.

`ProbeTask` writes each step number it starts to `progress_file` (from inside
the graph, with `tf.print`), so that a test outside the process can see how
far training got and kill it mid-loop. Its data are reshuffled every epoch
with a seed and an epoch is not a multiple of the checkpoint interval, so a
resume that restarted the input (or lost the dropout RNG) ends elsewhere.
"""

import sys

import gin
import keras
import numpy as np
import tensorflow as tf

import ctl
from tests.support.processes import wait_for_file
from tests.tasks import LateHeadTask, RegressionTask


@gin.configurable
class ProbeTask(RegressionTask):
    """RegressionTask + dropout + shuffle; optionally poisons the loss at given steps.

    Args:
      progress_file: if set, each step appends its number (1-based) to this file.
      nan_at_steps: steps whose loss is multiplied by NaN.
      transient: if True each of `nan_at_steps` is poisoned only the first time it
        runs in a process (a glitch); if False every time (bad data).
      dropout: rate of a Keras 3 Dropout on the features (0 for none).
      print_steps: if True each step also prints "probe step N" to the stderr of
        the process that runs it (under parameter servers: the worker).
      nan_replica: if set, only this replica's loss is poisoned (its id in the
        sync group: under multi-worker, worker 1's first replica is 1 with one
        replica per worker).
      progress_in_step: False leaves writing the progress to the trainer
        (`ProgressTrainer`), e.g. when XLA compiles the step.
      ballast_kb: if set, the model also holds a frozen weight of this many KiB,
        so that each checkpoint is at least that big (full-disk and slow-save tests).
      hold_at_step, hold_file: step `hold_at_step`, once it has written its
        progress, waits (up to 120 s) until `hold_file` exists: a test may act
        while it runs (signal the process) and then let it end.
      eval_progress_file, hold_at_eval_step: each eval step appends its number
        (counted over the process, from 1) to `eval_progress_file`; step
        `hold_at_eval_step` then waits for `hold_file` as above.

    Steps are counted by the optimizer's iterations (+ 1), unless a
    `GlobalStepTrainer` gave the task its `global_step`: then `nan_at_steps` are
    global steps, each poisoning the first step that starts at or past it
    (transient only). Under parameter servers the optimizer's iterations lose
    increments of concurrent steps (docs/faults.md) and two concurrent steps
    may start at the same global step, so only "at or past a global step" names
    a step there.
    """

    def __init__(self, progress_file=None, nan_at_steps=(), transient=True, dropout=0.25,
                 train_examples=120, nan_replica=None, print_steps=False,
                 progress_in_step=True, hold_at_step=None, hold_file=None,
                 eval_progress_file=None, hold_at_eval_step=None, ballast_kb=0, **kwargs):
        super().__init__(train_examples=train_examples, **kwargs)
        self.hold_at_step = hold_at_step
        self.hold_file = hold_file
        self.eval_progress_file = eval_progress_file
        self.hold_at_eval_step = hold_at_eval_step
        self.eval_steps_run = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self.progress_file = progress_file
        self.progress_in_step = progress_in_step
        self.dropout = dropout
        self.transient = transient
        self.nan_replica = nan_replica
        self.print_steps = print_steps
        self.ballast_kb = ballast_kb
        self.nan_at_steps = tf.constant(list(nan_at_steps) or [-1], tf.int64)
        # Not in any checkpoint: a restored run remembers which glitches fired.
        # Hits per poisoned step, only ever added to: concurrent parameter-server steps
        # cannot undo another step's hit (a read-modify-write of a flag could).
        self.fired = tf.Variable(tf.zeros_like(self.nan_at_steps, tf.int32), trainable=False)
        self.global_step = None  # Set by GlobalStepTrainer.

    def build_model(self):
        layers = [keras.Input((3,))]
        if self.dropout:
            layers.append(keras.layers.Dropout(self.dropout, seed=3))
        if self.ballast_kb:
            layers.append(_Ballast(self.ballast_kb))
        layers.append(keras.layers.Dense(1, kernel_initializer="zeros"))
        return keras.Sequential(layers)

    def build_inputs(self, training, input_context=None):
        if not training:
            return super().build_inputs(training, input_context)
        features, targets = _data(self.train_examples)
        dataset = tf.data.Dataset.from_tensor_slices((features, targets))
        batch_size = self.batch_size
        if input_context is not None:
            dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        return dataset.repeat().shuffle(64, seed=5).batch(batch_size, drop_remainder=True)

    def train_step(self, inputs, model, optimizer, metrics):
        step = tf.cast(optimizer.iterations, tf.int64) + 1
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        if self.progress_file and self.progress_in_step and not replica:  # One line per step.
            tf.print(step, output_stream=f"file://{self.progress_file}")
        if self.print_steps:
            tf.print("probe step", step, output_stream=sys.stderr)
        features, labels = inputs
        with tf.GradientTape() as tape:
            outputs = tf.cast(model(features, training=True), tf.float32)
            loss = self.build_losses(labels, outputs)
            if self.hold_at_step is not None:  # The loss waits for the hold: the step ends after it.
                loss *= tf.ensure_shape(tf.py_function(self._hold, [step], tf.float32), [])
            if self.nan_replica is None or replica == self.nan_replica:
                loss *= self._poison(step if self.global_step is None else
                                     tf.cast(self.global_step.read_value(), tf.int64) + 1)
            scaled_loss = optimizer.scale_loss(loss)  # / replicas (* the loss scale)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(scaled_loss, variables), variables))
        for metric in metrics:
            metric.update_state(labels, outputs)
        return {"loss": loss}

    def validation_step(self, inputs, model, metrics):
        if self.eval_progress_file:
            number = self.eval_steps_run.assign_add(1)
            tf.print(number, output_stream=f"file://{self.eval_progress_file}")
            if self.hold_at_eval_step is not None:  # The step's inputs wait for the hold.
                go = tf.ensure_shape(tf.py_function(self._hold_eval, [number], tf.float32), [])
                inputs = (inputs[0] * go, inputs[1])
        return super().validation_step(inputs, model, metrics)

    def _hold_eval(self, number):
        return self._hold(number, self.hold_at_eval_step)

    def _hold(self, step, hold_at=None):
        if int(step) == (self.hold_at_step if hold_at is None else hold_at):
            wait_for_file(self.hold_file, 120)
        return tf.constant(1.0)

    def _poison(self, step):
        if self.global_step is None:
            now = tf.equal(self.nan_at_steps, step)
        elif self.transient:
            now = step >= self.nan_at_steps  # The first step there hits; `fired` stops the others.
        else:
            raise ValueError("ProbeTask counts global steps only with transient=True")
        hit = tf.reduce_any(now & (self.fired.read_value() == 0)) if self.transient else tf.reduce_any(now)
        if self.transient:
            self.fired.assign_add(tf.cast(now, tf.int32))
        return tf.where(hit, tf.constant(np.nan, tf.float32), tf.constant(1.0, tf.float32))


class _Ballast(keras.layers.Layer):
    """Passes its input through; holds a frozen weight of `kb` KiB (in every checkpoint)."""

    def __init__(self, kb, **kwargs):
        super().__init__(**kwargs)
        self.kb = kb

    def build(self, input_shape):
        self.ballast = self.add_weight(shape=(self.kb * 256,), initializer="ones", trainable=False)

    def call(self, inputs):
        return inputs


def _data(count):
    features = np.random.default_rng(0).normal(size=(count, 3)).astype(np.float32)
    return features, features @ np.array([[1.0], [-2.0], [0.5]], np.float32)


@gin.configurable
class GlobalStepTrainer(ctl.Trainer):
    """A Trainer that gives its ProbeTask its `global_step`: `nan_at_steps` then count global steps."""

    def __init__(self, task, *args, **kwargs):
        super().__init__(task, *args, **kwargs)
        task.global_step = self.global_step


@gin.configurable
class ProgressTrainer(ctl.Trainer):
    """A Trainer that writes each step number it starts to its task's `progress_file`,
    from the train loop rather than from the task's step (which XLA may compile:
    `tf.print` has no XLA kernel)."""

    def train_step(self, iterator):
        progress = getattr(self.task, "progress_file", None)
        if progress:
            tf.print(self.global_step + 1, output_stream=f"file://{progress}")
        return super().train_step(iterator)


@gin.configurable
class DrawsWhenBuilt(RegressionTask):
    """Draws a number from TensorFlow's global random stream as it is built (as a task that
    makes random tables, or TensorFlow resources, when it is built): in `drawn`."""

    drawn = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        DrawsWhenBuilt.drawn.append(float(tf.random.uniform([])))


class LateDropoutTask(LateHeadTask):
    """A tf_keras model whose head, a Dropout and a Dense, is built on its first call, as BERT's
    pretrainer's next-sentence head is: its dropout's generator is made as the train step is
    traced, after the Trainer built its checkpoint."""

    def __init__(self):
        super().__init__("tf_keras", dropout=0.5, head_init="ones")
