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


# The longest tests not in an xdist group of several, first, in this order (their seconds in CI's
# `--durations`, 2-core host, at -n 2). `--dist loadgroup` hands out work units in collection order,
# the groups of several tests first (the longest ones: shared reference runs), one unit at a time to
# whichever test process is free: a long test handed out last keeps one process busy while the other
# has nothing left. Taken first, the run ends on short tests, on both processes at about the same
# time. A static list, not this host's timings: the order is the same on every run.
# `path::name` covers each parametrization, `path::name[id]` one.
LONGEST_FIRST = (
    "tests/test_cluster_faults.py::test_parameter_servers_lose_a_worker_the_coordinator_and_the_ps",  # 134
    "tests/test_sweep.py::test_stale_trials_of_a_dead_machine_are_taken_over_first_each_by_one_worker",  # 89
    "tests/test_sweep.py::test_a_signal_to_the_sweeps_process_group_leaves_every_running_trial_resumable"
    "[ctrl_c-2_workers-forked]",  # 80
    "tests/test_sweep.py::test_a_signal_to_the_sweeps_process_group_leaves_every_running_trial_resumable",  # 63
    "tests/test_sweep.py::test_a_sweep_file_that_does_not_match_its_study_is_one_line_and_more_trials_extend_it",
    "tests/test_model_garden_zoo.py::test_representative_experiments_train_with_model_gardens_numbers",  # 53
    "tests/test_sweep.py::test_sigterm_then_kill_9_then_a_dead_worker_taken_over_one_trial_resumed",  # 42
    "tests/test_sweep.py::test_forked_trials_end_as_the_same_trials_in_processes_of_their_own",  # 40
    "tests/test_multiworker.py::test_parameter_servers_train_to_the_target_step_beside_a_sidecar_evaluator",
    "tests/test_async_preemption.py::test_a_signal_during_an_async_save_names_the_checkpoint_a_restart_restores"
    "[gcs]",  # 36
    "tests/test_preemption.py::test_sigkill_inside_tf_while_loops_ends_bit_identical",  # 35
    "tests/test_preemption.py::test_sigkill_with_every_train_step_setting_ends_bit_identical",  # 34
    "tests/test_continuous_eval.py::test_one_owner_for_the_eval_side_effects_of_a_trainer_and_a_sidecar[gs]",
    "tests/test_docs.py::test_every_snippet_runs[docs/how-to/tune-hyperparameters.md]",  # 32
    "tests/test_docs.py::test_every_snippet_runs[docs/get-started/first-task.md]",  # 30
    "tests/test_gcs_model_dir.py::test_a_sidecar_killed_during_an_export_leaves_no_published_half_and_finishes_it",
    "tests/test_comforts.py::test_smoke_mode_passes_on_every_shipped_experiment[bert_classifier.gin]",  # 29
    "tests/test_model_garden_zoo.py::test_the_sidecar_column_compares_with_the_in_line_evaluation_of_the_same_"
    "checkpoint",  # 28
    "tests/test_claims.py::test_a_record_the_bucket_cannot_read_is_neither_taken_nor_lost",  # 28
    "tests/test_model_garden.py::test_retinanets_coco_evaluation_aggregates_nested_logs_on_default_and_mirrored",
    "tests/test_sweep.py::test_trials_on_a_bucket_with_the_study_and_the_logs_in_the_sweep_dir",  # 26
    "tests/test_gcs_model_dir.py::test_every_mode_runs_on_gs",  # 64 in CI; 25 here since it runs in-process
)


def longest_first_rank(item) -> int:
    """The place of `item` in `LONGEST_FIRST` (its own entry, else its function's), or its length.

    Args:
      item: a collected test.
    """
    path = item.nodeid.split("::", 1)[0]
    for key in (f"{path}::{item.name}", f"{path}::{item.originalname}"):
        if key in _RANKS:
            return _RANKS[key]
    return len(LONGEST_FIRST)


_RANKS = {entry: rank for rank, entry in enumerate(LONGEST_FIRST)}


def pytest_collection_modifyitems(config, items):
    """The tests of `LONGEST_FIRST` first, in its order; the others as collected (a stable sort)."""
    items.sort(key=longest_first_rank)


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
