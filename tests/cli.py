"""Running `python -m ctl.run` as a user would, and reading what it wrote."""

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_GIN = os.path.join(ROOT, "tests", "regression.gin")
# TensorFlow's own C++ log lines (e.g. "failed call to cuInit" on CPU-only hosts).
_TF_NATIVE_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ")


def ctl_command(*args, wrapper=()):
    """`python -m ctl.run args` (under the command `wrapper`, if any)."""
    return [*wrapper, sys.executable, "-m", "ctl.run", *args]


def ctl_env(env=None):
    """This process's environment, with this checkout first on PYTHONPATH and `env` on top."""
    return {**os.environ, "PYTHONPATH": ROOT, **(env or {})}


def run_ctl(*args, timeout=300, env=None, wrapper=()):
    """Runs ctl.run with `args` (under the command `wrapper`, if any); returns the
    CompletedProcess (text)."""
    return subprocess.run(ctl_command(*args, wrapper=wrapper), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=ctl_env(env))


class CtlProcess:
    """`python -m ctl.run args` started in the background, its stdout and stderr in files.

    Every wait is bounded; used as a context manager, the process is killed on the
    way out (SIGKILL, if it still runs).
    """

    def __init__(self, *args):
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(ctl_command(*args), cwd=ROOT, stdout=self._out,
                                     stderr=self._err, text=True, env=ctl_env())

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        self.kill()

    @staticmethod
    def _read(file):
        file.seek(0)
        return file.read()

    def stdout(self):
        return self._read(self._out)

    def stderr(self):
        return self._read(self._err)

    def wait_until(self, condition, timeout=120, poll_s=0.02):
        """Waits until `condition()` holds, looking every `poll_s` seconds (longer for a
        bucket: each look is a request); False if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(poll_s)
        raise TimeoutError(f"not reached in {timeout} s; stdout: {self.stdout()[-2000:]}")

    def wait_for_output(self, text, timeout=60):
        """Waits until the process has printed `text` on stdout."""
        if not self.wait_until(lambda: text in self.stdout(), timeout):
            raise AssertionError(f"the process ended without printing {text!r}; stderr: "
                                 f"{self.stderr()[-2000:]}")

    def finish(self, timeout=180):
        """Waits for the process to end (killed after `timeout` seconds); returns the
        CompletedProcess (text)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode,
                                           self.stdout(), self.stderr())

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


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
