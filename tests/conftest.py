"""Test setup: two logical CPU devices, so MirroredStrategy has two replicas."""

import functools
import os
import re
import uuid

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


@pytest.fixture(scope="session")
def gcs():
    """A GCS API on 127.0.0.1 (tests/gcs), with this process's env pointing `gs://` at it.

    Set before TensorFlow first touches `gs://`, and inherited by the processes a test
    starts (tests/cli.py passes os.environ on). One per test process (xdist worker).
    CTL_GCS_LATENCY_MS adds that many milliseconds to every request (a bucket's round trip).
    """
    from tests.gcs import GcsService

    service = GcsService(latency_ms=int(os.environ.get("CTL_GCS_LATENCY_MS", "0")))
    saved = {name: os.environ.get(name) for name in service.env()}
    os.environ.update(service.env())
    yield service
    service.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def gcs_dir(gcs, request):
    """A fresh `gs://BUCKET/...` dir for this test; faults or latency it sets end with it."""
    name = re.sub(r"[^\w.-]+", "-", request.node.name)[:80]
    yield f"gs://{gcs.bucket}/{name}-{uuid.uuid4().hex[:8]}"
    gcs.reset()
