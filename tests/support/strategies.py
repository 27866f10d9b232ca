"""The test process's two logical CPU devices, so that MirroredStrategy has two replicas."""

import functools

import tensorflow as tf

REPLICAS = 2


def split_the_cpu():
    """Makes the CPU two logical devices; before TensorFlow first uses it (tests/conftest.py)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)])


@functools.lru_cache(maxsize=None)
def mirrored():
    # One instance per process: two MirroredStrategy objects over the same devices
    # allocate the same collective keys, and TensorFlow refuses a gather under a
    # key an all-reduce used before ("Collective instance ... expected type").
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
