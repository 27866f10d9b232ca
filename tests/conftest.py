"""Test setup: two logical CPU devices, so MirroredStrategy has two replicas."""

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import gin  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

REPLICAS = 2
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)]
)


@functools.lru_cache(maxsize=None)
def mirrored():
    # One instance per process: two MirroredStrategy objects over the same devices
    # allocate the same collective keys, and TensorFlow refuses a gather under a
    # key an all-reduce used before ("Collective instance ... expected type").
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


@pytest.fixture(params=["default", "mirrored"])
def strategy(request):
    return tf.distribute.get_strategy() if request.param == "default" else mirrored()


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()
