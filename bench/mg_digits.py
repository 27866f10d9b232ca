"""The peer of figure 8: configs/digits.gin's job written with Model Garden's own Task and train_lib.

    python bench/mg_digits.py --model_dir=/tmp/mg_digits

The same model (64-128-10 MLP, tf_keras as Model Garden builds models), data
(scikit-learn's digits, the same split, shuffle and batch of 64), optimizer
(Adam, constant 1e-3) and schedule (2,000 steps in loops of 100, an evaluation
of the whole held-out set and a checkpoint every 500 steps, summaries every
loop) as `python -m ctl.run --mode=train_and_eval --gin_file=configs/digits.gin`,
run by `official.core.train_lib.run_experiment` in `train_and_eval` mode.
Imports nothing of ctl.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf
import tf_keras
from official.core import base_task, config_definitions as cfg, train_lib
from official.modeling.optimization.configs import optimization_config as optimization

from experiments.digits_data import load_split  # Imports no ctl


class DigitsTask(base_task.Task):
    """Model Garden's Task for the digits MLP."""

    def build_model(self):
        tf_keras.utils.set_random_seed(0)
        return tf_keras.Sequential([
            tf_keras.Input((64,)),
            tf_keras.layers.Dense(128, activation="relu"),
            tf_keras.layers.Dense(10),
        ])

    def build_inputs(self, params, input_context=None):
        images, labels = load_split(params.is_training)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        batch_size = params.global_batch_size
        if input_context is not None:
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        if params.is_training:
            dataset = dataset.repeat().shuffle(len(labels), seed=0)
        return dataset.batch(batch_size, drop_remainder=params.is_training).prefetch(2)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
            labels, model_outputs, from_logits=True))
        if aux_losses:
            loss += tf.add_n(aux_losses)
        return loss

    def build_metrics(self, training=True):
        return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]


def experiment_config(train_steps: int = 2000) -> cfg.ExperimentConfig:
    return cfg.ExperimentConfig(
        task=cfg.TaskConfig(
            train_data=cfg.DataConfig(is_training=True, global_batch_size=64),
            validation_data=cfg.DataConfig(is_training=False, global_batch_size=64)),
        trainer=cfg.TrainerConfig(
            train_steps=train_steps, steps_per_loop=100, summary_interval=100,
            validation_interval=500, validation_steps=-1, checkpoint_interval=500,
            max_to_keep=5,
            optimizer_config=optimization.OptimizationConfig({
                "optimizer": {"type": "adam", "adam": {"epsilon": 1e-7}},
                "learning_rate": {"type": "constant", "constant": {"learning_rate": 1e-3}},
            })))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--train_steps", type=int, default=2000)
    args = parser.parse_args()
    params = experiment_config(args.train_steps)
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        task = DigitsTask(params.task)
    _, logs = train_lib.run_experiment(strategy, task, "train_and_eval", params, args.model_dir)
    print(f"mg | done | {logs}", flush=True)


if __name__ == "__main__":
    main()
