"""Test setup: two logical CPU devices, so MirroredStrategy has two replicas."""

import gc
import os
import re
import subprocess
import threading
import uuid

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import gin
import pytest
import tensorflow as tf

from tests.support.strategies import mirrored, split_the_cpu
from tests.support.tiers import expensive_python
from tests.support.trained import trained_dir  # noqa: F401 - a fixture for every module

split_the_cpu()


@pytest.fixture(params=["default", "mirrored"])
def strategy(request):
    return tf.distribute.get_strategy() if request.param == "default" else mirrored()


class _Collector:
    """Collects each test's garbage on a thread of its own, off the next test's path.

    A test process runs hundreds of in-process runs, and their objects (trainers, Keras
    models, tf.functions, distributed iterators) sit in reference cycles until Python's
    collector finds them, at whatever allocation comes next: often inside a later test's
    tracing. Freeing a `MultiDeviceIterator` (MirroredStrategy's input) waits for its
    host pipeline's autotuning thread, which TensorFlow 2.20 does not wake: up to its
    optimization period, 60 s for an iterator alive that long (seen with gdb: the test's
    thread in `~LogicalThreadWrapper` under `~MultiDeviceIterator`, 80-200 s stalls of
    tests that take 1 s alone). TensorFlow lets go of the GIL meanwhile, so a collection
    on this thread after each test takes those waits off every test's path. So the
    automatic collection is off in test processes (`gc.disable()` below): left on, it still
    ran on a test's thread now and then (a 0.6 s test took 141 s in a full run).

    A collection holds the GIL while it walks the objects it looks at, so the test process
    waits for it all the same: a full one walks every object TensorFlow, Keras and the imports
    made (~450,000, ~1 s), which after every test was a third of the in-process tests' time.
    So after each test only the youngest generation is collected (what the test allocated:
    automatic collections being off, nothing was promoted since the last one), and every
    `FULL_EVERY`-th test all of them (a cycle through an older object, or a fixture's objects
    freed with their module).
    """

    FULL_EVERY = 25

    def __init__(self):
        self._thread = None
        self._count = 0

    def collect_soon(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._count += 1
            generation = 2 if self._count % self.FULL_EVERY == 0 else 0
            self._thread = threading.Thread(target=gc.collect, args=(generation,), daemon=True,
                                            name="tests-collect")
            self._thread.start()


_COLLECTOR = _Collector()
gc.disable()  # Only `_COLLECTOR` collects: after each test, on its own thread.


@pytest.fixture(autouse=True)
def garbage_collected_off_the_test_path():
    yield
    _COLLECTOR.collect_soon()


_POPEN_INIT = subprocess.Popen.__init__
_RUNNING = {"item": None}  # The test being set up, run or torn down (its fixtures too).


def _popen_init(self, args, *more, **kwargs):
    """A test not marked `slow` (the fast tier), or a fixture it sets up, fails if it starts a
    Python process other than the cheap ones of tests/support/tiers.py."""
    item = _RUNNING["item"]
    if item is not None and not item.get_closest_marker("slow") and expensive_python(args):
        command = args if isinstance(args, str) else " ".join(map(str, args))
        pytest.fail(f"{item.nodeid} is not marked slow but starts a Python process: {command[:300]}; "
                    "mark it @pytest.mark.slow, or run the code in this process "
                    "(tests/support/tiers.py).", pytrace=False)
    _POPEN_INIT(self, args, *more, **kwargs)


subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING["item"] = item
    try:
        yield
    finally:
        _RUNNING["item"] = None


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(scope="session")
def gcs():
    """A GCS API on 127.0.0.1 (tests/gcs), with this process's env pointing `gs://` at it.

    Set before TensorFlow first touches `gs://`, and inherited by the processes a test
    starts (tests/support/env.py passes os.environ on). One per test process (xdist worker).
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
