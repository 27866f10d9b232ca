"""Reading what a run wrote (summaries, checkpoints, files, exports) and what ctl said on stderr."""

import hashlib
import os
import re

import tensorflow as tf

# TensorFlow's own C++ log lines (e.g. "failed call to cuInit" on CPU-only hosts).
_TF_NATIVE_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ")


def ctl_stderr_lines(stderr: str):
    """stderr without TensorFlow's native log lines (and their tab-indented continuation
    lines): what ctl itself said."""
    lines, native = [], False
    for line in stderr.splitlines():
        native = bool(_TF_NATIVE_LOG.match(line)) or (native and line.startswith("\t"))
        if line.strip() and not native:
            lines.append(line)
    return lines


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


def assert_bit_equal(path_a, path_b):
    """The two checkpoints hold the same variables, bit for bit."""
    a, b = checkpoint_values(path_a), checkpoint_values(path_b)
    assert sorted(a) == sorted(b)
    for name in a:
        if a[name] is not None:  # The input position's state has no array form.
            assert a[name].tobytes() == b[name].tobytes(), name


def latest_step(model_dir):
    """The step of the newest checkpoint in `model_dir` (0: none)."""
    path = tf.train.latest_checkpoint(model_dir)
    return int(path.rsplit("-", 1)[1]) if path else 0


def model_at(path, task=None):
    """`task`'s model (default: tests/tasks.py's RegressionTask) with the weights of the
    checkpoint at `path`."""
    from tests.tasks import RegressionTask

    model = (task or RegressionTask()).build_model()
    tf.train.Checkpoint(model=model).read(path).expect_partial()
    return model


def served(export_dir, features):
    """The outputs of the SavedModel at `export_dir`'s serving signature for `features`."""
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    return signature(**{name: tf.constant(features)})["outputs"].numpy()


def exported(model_dir, name):
    """The steps exported under `export/<name>` of `model_dir`, in order."""
    return sorted(int(s) for s in os.listdir(os.path.join(model_dir, "export", name))
                  if s.isdigit())
