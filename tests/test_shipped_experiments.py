"""The shipped experiments, run as a user runs them, and their data loading (the digits one: the
first run page's run, tests/test_docs.py)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from experiments import records
from tests.support.env import ROOT
from tests.support.in_process import ctl_in_process
from tests.support.reading import scalars

pytestmark = pytest.mark.slow


# The digits experiment (configs/digits.gin, the README's main job) reaching 98%: checked on the
# first run page's own run of it (tests/test_docs.py, `the_main_job_reaches_98_percent`).


def test_model_garden_bert_trains_from_tfrecord_files(tmp_path):
    data_dir = tmp_path / "data"
    # The command's main in this process (no TensorFlow import to pay).
    result = ctl_in_process("--mode=train_and_eval", f"--model_dir={tmp_path / 'run'}",
                            f"--gin_file={os.path.join(ROOT, 'configs', 'bert_classifier.gin')}",
                            "--gin_bindings=TRAIN_STEPS=300", "--gin_bindings=ctl.Schedule.eval_interval=300",
                            f"--gin_bindings=BertClassifierTask.data_dir='{data_dir}'")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(data_dir)) == [
        "eval-00000-of-00002.tfrecord", "eval-00001-of-00002.tfrecord",
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert scalars(os.path.join(tmp_path, "run", "eval"))["accuracy"][300] > 0.8


def test_records_round_trip_and_shard_per_pipeline(tmp_path):
    examples = [{"ids": np.array([i, i + 1]), "label": np.array([i % 2])} for i in range(10)]
    records.write_shards(str(tmp_path), "train", examples, num_shards=2)
    shapes = {"ids": (2,), "label": (1,)}
    everything = list(records.read_dataset(str(tmp_path), "train", shapes))
    assert sorted(int(e["ids"][0]) for e in everything) == list(range(10))
    assert everything[0]["ids"].dtype == tf.int32
    seen = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline)
        seen.append({int(e["ids"][0]) for e in records.read_dataset(str(tmp_path), "train",
                                                                    shapes, context)})
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(10))
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_missing_shards_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        records.read_dataset(str(tmp_path), "train", {"ids": (2,)})
