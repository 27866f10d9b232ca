"""Small real tasks for loop tests: linear regression in Keras 3 or tf_keras."""

import gin
import keras
import numpy as np
import tensorflow as tf
import tf_keras

import ctl

FLAVORS = {"keras3": keras, "tf_keras": tf_keras}
TRUE_WEIGHTS = np.array([[1.0], [-2.0], [0.5]], np.float32)


def regression_data(count: int, seed: int = 0):
    features = np.random.default_rng(seed).normal(size=(count, 3)).astype(np.float32)
    return features, features @ TRUE_WEIGHTS


@gin.configurable
class RegressionTask(ctl.Task):
    """Fits `y = x @ TRUE_WEIGHTS` with one Dense layer and SGD.

    The train set is read in a fixed order (no shuffle), so two runs that see
    the same global batches reach the same weights.
    """

    def __init__(self, flavor="keras3", batch_size=8, learning_rate=0.1,
                 train_examples=64, eval_examples=10):
        self.k = FLAVORS[flavor]
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.train_examples = train_examples
        self.eval_examples = eval_examples

    def build_model(self):
        return self.k.Sequential(
            [self.k.Input((3,)), self.k.layers.Dense(1, kernel_initializer="zeros")]
        )

    def build_optimizer(self):
        return self.k.optimizers.SGD(self.learning_rate)

    def build_inputs(self, training, input_context=None):
        features, targets = regression_data(
            self.train_examples if training else self.eval_examples, seed=0 if training else 1
        )
        dataset = tf.data.Dataset.from_tensor_slices((features, targets))
        batch_size = self.batch_size
        if input_context is not None:
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        if training:
            dataset = dataset.repeat()
        return dataset.batch(batch_size, drop_remainder=training)

    def build_losses(self, labels, outputs, aux_losses=None):
        return tf.reduce_mean(tf.square(labels - outputs))

    def build_metrics(self, training=True):
        # Sum of ones over examples: counts what an evaluation saw.
        return [CountExamples()] if not training else [self.k.metrics.MeanAbsoluteError("mae")]


class CountExamples(keras.metrics.Sum):
    def __init__(self):
        super().__init__(name="examples")

    def update_state(self, labels, outputs, sample_weight=None):
        return super().update_state(tf.ones_like(labels[:, 0]))


@gin.configurable
class PredictionsTask(RegressionTask):
    """Collects every eval prediction on the host (aggregate_logs)."""

    def validation_step(self, inputs, model, metrics):
        logs = super().validation_step(inputs, model, metrics)
        logs["predictions"] = model(inputs[0], training=False)[:, 0]
        return logs

    def aggregate_logs(self, state, step_logs):
        state = [] if state is None else state
        return state + [p for p in step_logs["predictions"]]

    def reduce_aggregated_logs(self, aggregated_logs, global_step):
        predictions = np.concatenate(aggregated_logs)
        return {"predicted_examples": len(predictions), "mean_prediction": predictions.mean()}



@gin.configurable
class WideTask(RegressionTask):
    """Like RegressionTask, with a hidden layer: its checkpoints do not fit RegressionTask."""

    def build_model(self):
        return self.k.Sequential([self.k.Input((3,)), self.k.layers.Dense(4), self.k.layers.Dense(1)])


class LateHeadTask(RegressionTask):
    """A tf_keras model whose head, a Dense(1) (after a Dropout with `dropout`), is made on its first call,
    as BERT's pretrainer's heads are, with a legacy optimizer (Model Garden's kind: makes its slots as it
    goes; Keras 3's and tf_keras' new ones are built for the variables there are).

    Args:
        flavor: the Keras of the model (`tf_keras`: its legacy optimizer).
        dropout: the rate of a Dropout before the head, with a generator of its own made as the train step
            is traced, after the Trainer built its checkpoint (as BERT's next-sentence head's is); None: none.
        head_init: the head's kernel initializer.
        **kwargs: RegressionTask's.
    """

    def __init__(self, flavor="tf_keras", dropout=None, head_init="zeros", **kwargs):
        super().__init__(flavor, **kwargs)
        self.dropout, self.head_init = dropout, head_init

    def build_model(self):
        k, rate, head_init = self.k, self.dropout, self.head_init

        class LateHead(k.Model):
            def __init__(self):
                super().__init__()
                self.body = k.layers.Dense(3, kernel_initializer="identity")
                self.body.build((None, 3))
                if rate is not None:
                    # A generator of its own (as `ctl.FaultTolerance.seed` makes every tf_keras
                    # layer draw from), without switching it on for the rest of the session.
                    self.dropout = k.layers.Dropout(rate, seed=7, rng_type="stateful")
                self.head = k.layers.Dense(1, kernel_initializer=head_init)

            def call(self, inputs, training=None):
                hidden = self.body(inputs)
                if rate is not None:
                    hidden = self.dropout(hidden, training=training)
                return self.head(hidden)

        return LateHead()

    def build_optimizer(self):
        return self.k.optimizers.legacy.SGD(self.learning_rate)
