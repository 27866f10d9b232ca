"""Each entry of ctl/compat.py against the installed dependencies.

These fail, naming the dependency and its version, the day an internal that
ctl/compat.py relies on moves (or the bug it works around is fixed upstream).
"""

from importlib import metadata
import os
import subprocess
import sys

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from ctl import compat
from ctl.core.checkpoint_contents import SavedGraph

TF = f"tensorflow {metadata.version('tensorflow')}"
KERAS = f"keras {metadata.version('keras')}"
GIN = f"gin-config {metadata.version('gin-config')}"


def _keras3_checkpoint():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return model, tf.train.Checkpoint(model=model, optimizer=optimizer)


def _save_async_twice(checkpoint, directory):
    options = tf.train.CheckpointOptions(enable_async=True)
    paths = [checkpoint.save(os.path.join(directory, "ckpt"), options=options) for _ in range(2)]
    checkpoint.sync()
    return paths


def test_keras3_still_needs_its_async_checkpoint_entry(tmp_path):
    """TensorFlow's public async option alone fails on the second save of a Keras 3 model."""
    _, checkpoint = _keras3_checkpoint()
    try:
        _save_async_twice(checkpoint, str(tmp_path))
    except ValueError:
        return
    pytest.fail(f"with {KERAS} and {TF}, async checkpoints of Keras 3 variables work without "
                "ctl.compat.share_keras_cpu_twins: drop that entry.")


def test_keras3_async_checkpoints_with_shared_twins_hold_the_latest_values(tmp_path):
    model, checkpoint = _keras3_checkpoint()
    shared = compat.share_keras_cpu_twins(tf.train.TrackableView(checkpoint).descendants())
    assert shared >= len(model.variables), (
        f"{KERAS}: ctl.compat.share_keras_cpu_twins found {shared} Keras 3 variables of "
        f"{len(model.variables)}; Keras' Variable no longer wraps a tf.Variable as `.value` "
        "with `_copy_trackable_to_cpu`.")
    model.variables[0].assign(tf.ones_like(model.variables[0]))
    try:
        paths = _save_async_twice(checkpoint, str(tmp_path))
    except (ValueError, AttributeError) as error:
        pytest.fail(f"ctl.compat.share_keras_cpu_twins no longer works with {KERAS} and {TF}: "
                    f"{error}")
    model.variables[0].assign(tf.zeros_like(model.variables[0]))
    checkpoint.read(paths[-1]).expect_partial()
    np.testing.assert_array_equal(model.variables[0].numpy(), 1.0)


def test_gin_registry_lists_the_configurables():
    import ctl

    ctl.import_api()  # Registers ctl's configurables (`import ctl` alone imports nothing).
    names = compat.registered_configurables()
    assert "ctl.Schedule" in names and "ctl.Trainer" in names, (
        f"{GIN}: ctl.compat.registered_configurables() no longer finds gin's registry "
        "(gin.config._REGISTRY._selector_map).")
    gin.clear_config()


def test_model_garden_registry_lists_the_experiments():
    pytest.importorskip("official")
    from official.nlp.configs import wmt_transformer_experiments  # noqa: F401
    import official.vision.registry_imports  # noqa: F401

    names = compat.registered_experiments()
    assert {"resnet_imagenet", "retinanet_resnetfpn_coco", "wmt_transformer/large"} <= set(names), (
        f"tf-models-official {metadata.version('tf-models-official')}: "
        "ctl.compat.registered_experiments() no longer lists Model Garden's experiments "
        "(official.core.exp_factory._REGISTERED_CONFIGS, nested names joined by '/').")


def test_a_model_garden_registry_that_moved_fails_loudly(monkeypatch):
    # Not an empty list, which would read as "no experiment is registered": the did-you-mean of
    # an unknown experiment and the zoo's list of experiments would go quietly wrong.
    pytest.importorskip("official")
    from official.core import exp_factory

    from ctl.adapters import model_garden

    monkeypatch.delattr(exp_factory, "_REGISTERED_CONFIGS")
    with pytest.raises(RuntimeError, match=r"ctl.compat.registered_experiments: Model Garden's "
                       r"official.core.exp_factory has no dict _REGISTERED_CONFIGS any more "
                       r"\(tf-models-official \d"):
        model_garden.registered_experiments()


def test_object_graph_maps_paths_to_keys(tmp_path):
    step = tf.Variable(7, dtype=tf.int64)
    model, checkpoint = _keras3_checkpoint()
    checkpoint.global_step = step
    path = checkpoint.write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    try:
        graph = SavedGraph(reader)
    except Exception as error:  # Any failure here is the message below
        pytest.fail(f"{TF}: ctl.compat.checkpoint_object_graph cannot read a checkpoint's "
                    f"object graph ({error!r}).")
    assert sorted(graph.root_children()) == ["global_step", "model", "optimizer"], TF
    assert int(reader.get_tensor(graph.key(graph.node("global_step")))) == 7, TF
    assert len(graph.variables_under(graph.node("model"))) == len(model.weights), TF


def test_a_name_based_checkpoint_has_no_object_graph(tmp_path):
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("v", initializer=1.0)
        saver = tf.compat.v1.train.Saver([variable])
        with tf.compat.v1.Session() as session:
            session.run(variable.initializer)
            path = saver.save(session, str(tmp_path / "tf1"))
    with pytest.raises(ValueError, match="name-based"):
        compat.checkpoint_object_graph(tf.train.load_checkpoint(path))


@pytest.mark.slow  # TensorFlow reads TF_ENABLE_ONEDNN_OPTS as it is imported: a process each.
def test_a_seeded_process_says_what_is_left_to_chance_on_a_cpu():
    # Model Garden's DeepLab gave other gradients and weights, in the last bits, under op
    # determinism (python -m bench.model_garden_zoo.guarantees seg_deeplabv3_pascal --gradients):
    # a seeded CPU process says so once, and how to be bit for bit; not once it is.
    from ctl.faults.resume import CPU_NOTE
    from tests.support.env import ctl_env

    code = ("from ctl.utils import console; from ctl.faults import resume; "
            "console.install(); print('oneDNN', resume.onednn_on()); "
            "resume.seed_everything(1); resume.seed_everything(2)")
    for onednn, interop, said in (("1", "1", 1), ("0", "", 1), ("0", "1", 0)):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=300, env={**ctl_env(), "TF_ENABLE_ONEDNN_OPTS": onednn,
                                                  "TF_NUM_INTEROP_THREADS": interop,
                                                  "CUDA_VISIBLE_DEVICES": ""})
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"oneDNN {onednn == '1'}" in result.stdout, f"{TF}: TF_ENABLE_ONEDNN_OPTS={onednn}"
        assert result.stdout.count(CPU_NOTE) == said, (onednn, interop, result.stdout)
