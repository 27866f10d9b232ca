"""Data for the Model Garden experiments, generated from a seed in Model Garden's own formats.

Nothing is downloaded: on first use each function writes TFRecord shards into
its data dir (atomically, like experiments/records.py) and returns the
`params_override` that points the experiment's `train_data` and
`validation_data` at them, for `ctl.ModelGardenTask.params_override`.

- `image_classification_data`: JPEG-encoded images in Model Garden's vision
  `tf.Example` format (`image/encoded`, `image/class/label`, ... written by
  `official.vision.data.tf_example_builder`), a class per dominant colour
  channel, with noise.
- `sentence_prediction_data`: token ids in the format of Model Garden's
  sentence-prediction data loader (`input_ids`, `input_mask`, `segment_ids`,
  `label_ids`); the label says whether low ids outnumber high ones.
"""

import os
import tempfile
from typing import Any, Callable, Dict, Iterable, Optional

import gin
import numpy as np
import tensorflow as tf

import ctl
from experiments.checks import AtLeastOne, Seed, SeqLength, VocabSize

SPLITS = {"train": 0, "eval": 1}


def _data_dir(kind: str, data_dir: str, seed: int, *parts) -> str:
    name = "-".join(str(p) for p in (kind, *parts, seed))
    return data_dir or os.path.join(tempfile.gettempdir(), f"ctl-data-{name}")


def _write_once(directory: str, split: str, examples: Callable[[], Iterable[bytes]],
                num_shards: int = 2) -> str:
    """Writes the serialized examples of `split` as shards, unless they exist; returns the glob."""
    pattern = os.path.join(directory, f"{split}-*-of-{num_shards:05d}.tfrecord")
    if len(tf.io.gfile.glob(pattern)) == num_shards:
        return pattern
    tf.io.gfile.makedirs(directory)
    paths = [os.path.join(directory, f"{split}-{k:05d}-of-{num_shards:05d}.tfrecord")
             for k in range(num_shards)]
    temps = [f"{path}.tmp-{os.getpid()}" for path in paths]
    writers = [tf.io.TFRecordWriter(temp) for temp in temps]
    for index, record in enumerate(examples()):
        writers[index % num_shards].write(record)
    for writer, temp, path in zip(writers, temps, paths):
        writer.close()
        tf.io.gfile.rename(temp, path, overwrite=True)
    return pattern


@gin.configurable
@ctl.check_arguments
def image_classification_data(data_dir: Optional[str] = None, seed: Seed = 0,
                              image_size: AtLeastOne = 32, num_classes: AtLeastOne = 3,
                              train_examples: AtLeastOne = 256,
                              eval_examples: AtLeastOne = 64) -> Dict[str, Any]:
    """Generates (once) JPEG images of `num_classes` classes; returns the params_override."""
    from official.vision.data import tf_example_builder

    directory = _data_dir("images", data_dir, seed, image_size, num_classes)

    def examples(split: str, count: int):
        rng = np.random.default_rng([seed, SPLITS[split]])
        for _ in range(count):
            label = int(rng.integers(num_classes))
            image = rng.normal(96, 24, size=(image_size, image_size, 3))
            image[..., label % 3] += 96  # The class's colour dominates.
            image = np.clip(image, 0, 255).astype(np.uint8)
            builder = tf_example_builder.TfExampleBuilder()
            builder.add_image_matrix_feature(image, "JPEG", label=label)
            yield builder.example.SerializeToString()

    train = _write_once(directory, "train", lambda: examples("train", train_examples))
    evals = _write_once(directory, "eval", lambda: examples("eval", eval_examples))
    return {"task": {"model": {"num_classes": num_classes,
                               "input_size": [image_size, image_size, 3]},
                     "train_data": {"input_path": train},
                     "validation_data": {"input_path": evals}}}


@gin.configurable
@ctl.check_arguments
def sentence_prediction_data(data_dir: Optional[str] = None, seed: Seed = 0,
                             seq_length: SeqLength = 16, vocab_size: VocabSize = 32,
                             train_examples: AtLeastOne = 512,
                             eval_examples: AtLeastOne = 128) -> Dict[str, Any]:
    """Generates (once) token sequences with a binary label; returns the params_override."""
    directory = _data_dir("sentences", data_dir, seed, seq_length, vocab_size)

    def int_feature(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    def examples(split: str, count: int):
        rng = np.random.default_rng([seed, SPLITS[split]])
        for _ in range(count):
            tokens = rng.integers(2, vocab_size, size=seq_length - 1)  # 0 pad, 1 [CLS].
            label = int(np.sum(tokens < vocab_size // 2 + 1) > np.sum(tokens >= vocab_size // 2 + 1))
            features = {"input_ids": int_feature([1, *tokens]),
                        "input_mask": int_feature([1] * seq_length),
                        "segment_ids": int_feature([0] * seq_length),
                        "label_ids": int_feature([label])}
            yield tf.train.Example(
                features=tf.train.Features(feature=features)).SerializeToString()

    train = _write_once(directory, "train", lambda: examples("train", train_examples))
    evals = _write_once(directory, "eval", lambda: examples("eval", eval_examples))
    return {"task": {"train_data": {"input_path": train, "seq_length": seq_length},
                     "validation_data": {"input_path": evals, "seq_length": seq_length},
                     "model": {"encoder": {"bert": {"vocab_size": vocab_size}}}}}
