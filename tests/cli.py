"""Running `python -m ctl.run` as a user would, and reading what it wrote."""

import hashlib
import os
import re
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_GIN = os.path.join(ROOT, "tests", "regression.gin")
# TensorFlow's own C++ log lines (e.g. "failed call to cuInit" on CPU-only hosts).
_TF_NATIVE_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ")


def run_ctl(*args, timeout=300, env=None):
    """Runs ctl.run with `args`; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "ctl.run", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
    )


def ctl_stderr_lines(stderr: str):
    """stderr without TensorFlow's native log lines: what ctl itself said."""
    return [line for line in stderr.splitlines() if line.strip() and not _TF_NATIVE_LOG.match(line)]


def snapshot(directory: str):
    """Maps every file under `directory` (local or in a bucket) to a hash of its bytes."""
    files = {}
    for root, _, names in tf.io.gfile.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with tf.io.gfile.GFile(path, "rb") as f:
                files[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return files


def scalars(summary_dir: str):
    """Maps tag -> {step: value} for every scalar in the event files of `summary_dir`."""
    values = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(summary_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    values.setdefault(value.tag, {})[event.step] = "text"
                    continue
                number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                values.setdefault(value.tag, {})[event.step] = float(number)
    return values


def checkpoint_values(path: str):
    """name -> array of every variable of a checkpoint but the save counter and object graph.

    The train input's position (`train_input/...`, a tf.data iterator state of
    dtype variant) has no array form: its name maps to None.
    """
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    return {name: None if dtype == tf.variant else reader.get_tensor(name)
            for name, dtype in dtypes.items()
            if not name.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))}
