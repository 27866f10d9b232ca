"""A Model Garden BERT encoder (tf_keras) classifying generated token sequences.

Shows that models from the TensorFlow ecosystem drop into ctl unchanged: the
model is `official.nlp.modeling.models.BertClassifier` over a tiny
`BertEncoderV2`, trained on data generated from a seed.

The data: sequences of random token ids; the label says whether tokens from
the lower half of the vocabulary outnumber those from the upper half.
"""

import os
import tempfile
from typing import Annotated, Optional

import gin
import numpy as np
import tensorflow as tf
import tf_keras
# Imported at module level: Model Garden registers gin configurables on import,
# which gin accepts only while the config is being parsed.
from official.nlp.modeling import models, networks

import ctl
from experiments import records
from experiments.checks import AtLeastOne, LearningRate, Seed, SeqLength, VocabSize

SPLITS = {"train": 4096, "eval": 500}

# tf_keras' learning-rate schedules, for configs/bert_classifier.gin.
ctl.register_schedules(tf_keras)


def generate(split: str, seq_length: int, vocab_size: int, seed: int):
    """Yields the examples of `split`, the same ones for the same arguments."""
    rng = np.random.default_rng([seed, list(SPLITS).index(split)])
    for _ in range(SPLITS[split]):
        # Ids 0 and 1 are reserved (padding, [CLS]).
        tokens = rng.integers(2, vocab_size, size=seq_length - 1)
        label = int(np.sum(tokens < vocab_size // 2 + 1) > np.sum(tokens >= vocab_size // 2 + 1))
        yield {"input_word_ids": np.concatenate([[1], tokens]), "label": np.array([label])}


ATTENTION_HEADS = 2


@gin.configurable
@ctl.check_arguments
class BertClassifierTask(ctl.Task):
    """Binary classification with a tiny BERT from Model Garden (Keras 2, tf_keras)."""

    def __init__(self, seq_length: SeqLength = 16, vocab_size: VocabSize = 32,
                 hidden_size: Annotated[int, ctl.Range(at_least=ATTENTION_HEADS), ctl.Check(
                     lambda size: size % ATTENTION_HEADS == 0,
                     f"a multiple of {ATTENTION_HEADS} (the attention heads)")] = 32,
                 num_layers: AtLeastOne = 1, batch_size: AtLeastOne = 32,
                 learning_rate: LearningRate = 1e-3, data_dir: Optional[str] = None,
                 seed: Seed = 0):
        self.seq_length = seq_length
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.seed = seed
        self.data_dir = data_dir or os.path.join(
            tempfile.gettempdir(), f"ctl-data-bert-{seq_length}-{vocab_size}-{seed}")

    def build_model(self):
        tf_keras.utils.set_random_seed(self.seed)
        encoder = networks.BertEncoderV2(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_attention_heads=ATTENTION_HEADS, inner_dim=2 * self.hidden_size,
            max_sequence_length=self.seq_length)
        model = models.BertClassifier(network=encoder, num_classes=2)
        ids = tf.ones((1, self.seq_length), tf.int32)
        model({"input_word_ids": ids, "input_mask": ids, "input_type_ids": 0 * ids})
        return model

    def build_optimizer(self):
        return tf_keras.optimizers.Adam(self.learning_rate)

    def build_inputs(self, training, input_context=None):
        split = "train" if training else "eval"
        if not records.has_shards(self.data_dir, split):
            records.write_shards(self.data_dir, split, generate(
                split, self.seq_length, self.vocab_size, self.seed))
        dataset = records.read_dataset(
            self.data_dir, split, {"input_word_ids": (self.seq_length,), "label": (1,)},
            input_context)
        dataset = dataset.map(_to_features_and_label)
        batch_size = (input_context.get_per_replica_batch_size(self.batch_size)
                      if input_context else self.batch_size)
        if training:
            dataset = dataset.repeat().shuffle(1024, seed=self.seed)
        return dataset.batch(batch_size, drop_remainder=training).prefetch(2)

    def build_losses(self, labels, outputs, aux_losses=None):
        loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
            labels, outputs, from_logits=True))
        if aux_losses:
            loss += tf.add_n(aux_losses)
        return loss

    def build_metrics(self, training=True):
        return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")]


def _to_features_and_label(example):
    ids = example["input_word_ids"]
    features = {"input_word_ids": ids, "input_mask": tf.ones_like(ids),
                "input_type_ids": tf.zeros_like(ids)}
    return features, example["label"][0]
