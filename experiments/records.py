"""Generated data on disk: TFRecord files written once, read back with tf.data.

The experiments that do not ship with a data set generate one from a seed,
write it as TFRecord shards, and then read it the way a real input pipeline
would (file list, interleave, parse), so the loading code is exercised for
real on small files.
"""

import os
from typing import Dict, Iterable

import numpy as np
import tensorflow as tf


def write_shards(directory: str, split: str, examples: Iterable[Dict[str, np.ndarray]],
                 num_shards: int = 2) -> None:
    """Writes int64 examples to `<directory>/<split>-0000K-of-0000N.tfrecord`.

    The shards appear only when complete (each is written to a temporary name
    and renamed), so a reader never sees half a file.
    """
    tf.io.gfile.makedirs(directory)
    paths = [shard_path(directory, split, k, num_shards) for k in range(num_shards)]
    writers = [tf.io.TFRecordWriter(f"{p}.tmp-{os.getpid()}") for p in paths]
    for index, example in enumerate(examples):
        features = {name: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v)))
                    for name, v in example.items()}
        record = tf.train.Example(features=tf.train.Features(feature=features))
        writers[index % num_shards].write(record.SerializeToString())
    for writer, path in zip(writers, paths):
        writer.close()
        tf.io.gfile.rename(f"{path}.tmp-{os.getpid()}", path, overwrite=True)


def shard_path(directory: str, split: str, index: int, count: int) -> str:
    return os.path.join(directory, f"{split}-{index:05d}-of-{count:05d}.tfrecord")


def has_shards(directory: str, split: str) -> bool:
    return bool(tf.io.gfile.glob(os.path.join(directory, f"{split}-*-of-*.tfrecord")))


def read_dataset(directory: str, split: str, shapes: Dict[str, tuple],
                 input_context=None) -> tf.data.Dataset:
    """Parses the shards of `split` into dicts of int32 tensors of `shapes`.

    With an `input_context`, each input pipeline reads its own subset of the
    files (or of the records, when there are fewer files than pipelines).
    """
    files = sorted(tf.io.gfile.glob(os.path.join(directory, f"{split}-*-of-*.tfrecord")))
    if not files:
        raise FileNotFoundError(f"no {split} shards in {directory}")
    dataset = tf.data.TFRecordDataset(files)
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    spec = {name: tf.io.FixedLenFeature(shape, tf.int64) for name, shape in shapes.items()}

    def parse(record):
        parsed = tf.io.parse_single_example(record, spec)
        return {name: tf.cast(value, tf.int32) for name, value in parsed.items()}

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
