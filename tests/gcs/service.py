"""A GCS API on 127.0.0.1: gcp-storage-emulator as Google's hosts, for TensorFlow's `gs://`.

TensorFlow's GCS filesystem talks to a fixed endpoint (https://www.googleapis.com), but
honours HTTPS_PROXY, CURL_CA_BUNDLE, GOOGLE_AUTH_TOKEN_FOR_TESTING and NO_GCE_CHECK. So
the service starts the emulator (tests/gcs/emulator.py), which is also the HTTPS proxy
that answers for Google's hosts, and `env()` gives the variables that point TensorFlow
there, with the test CA (tests/gcs/tls/ca.pem) as the only one trusted: nothing is
installed by hand.
"""

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tests.support.env import ROOT, ctl_env

_HERE = os.path.dirname(os.path.abspath(__file__))
CA_BUNDLE = os.path.join(_HERE, "tls", "ca.pem")  # The test CA: it signed only the emulator's.
_START_TIMEOUT_S = 60
_PR_SET_PDEATHSIG = 1


def _end_with_parent():
    """In the child, before exec: SIGTERM when the process that started it dies (Linux),
    so a killed test run leaves no emulator behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class GcsService:
    """The emulator, as a child process; `stop()` ends it.

    `latency_ms` is added to every request (a bucket's round trip).
    """

    def __init__(self, bucket: str = "ctl-test", latency_ms: int = 0):
        self.bucket = bucket
        self.latency_ms = latency_ms
        self.workdir = tempfile.mkdtemp(prefix="ctl-gcs-")
        self._control_file = os.path.join(self.workdir, "control.json")
        self._control = {}
        self._log_path = os.path.join(self.workdir, "emulator.log")
        with open(self._log_path, "w") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.gcs.emulator", self.bucket, self._control_file,
                 str(self.latency_ms)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=ctl_env({"PYTHONUNBUFFERED": "1"}),
                preexec_fn=_end_with_parent)
        try:
            self.proxy_port = int(self._wait_for(re.compile(r"port=(\d+)")))
        except BaseException:
            self.stop()
            raise

    def _wait_for(self, pattern):
        """The first group of `pattern` in the emulator's log, waiting at most a minute."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self._log_path) as f:
                match = pattern.search(f.read())
            if match:
                return match.group(1)
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        with open(self._log_path) as f:
            raise RuntimeError(f"the GCS emulator did not start (exit {self._process.poll()}):\n"
                               f"{f.read()[-3000:]}")

    def env(self) -> dict:
        """What a process needs for `gs://` to reach this service."""
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        local = "127.0.0.1,localhost,::1"  # gRPC and others honour these too: keep them direct.
        return {
            "HTTPS_PROXY": proxy, "https_proxy": proxy,
            "NO_PROXY": local, "no_proxy": local,
            "CURL_CA_BUNDLE": CA_BUNDLE,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
            "NO_GCE_CHECK": "true",
        }

    def inject_faults(self, rules):
        """Each request matching a rule is answered with the rule's status.

        A rule is a dict: `status` (e.g. 503) or `delay_ms` (the request is held that
        long, then answered with `status` if the rule has one, else forwarded), and
        optionally `methods` (e.g. ["POST", "PUT"]) and `path_contains` (a substring of the
        path and query, e.g. "/upload/" or an object's name, URL-encoded). `reset()` ends them.
        """
        self._control["faults"] = list(rules)
        self._write_control()

    def set_latency(self, latency_ms: int):
        """From the next request on, `latency_ms` is added to each one."""
        self._control["latency_ms"] = int(latency_ms)
        self._write_control()

    def log_requests(self, path):
        """From the next request on, each is appended to `path` as one JSON line once answered:
        `start` and `end` (time.time()), `method`, `host`, `path` (with the query). None stops.

        Args:
            path: the log file (appended to), or None.
        """
        if path is None:
            self._control.pop("log", None)
        else:
            self._control["log"] = os.path.abspath(path)
        self._write_control()

    def reset(self):
        """No faults, and the latency the service started with."""
        self._control = {}
        self._write_control()

    def _write_control(self):
        # The emulator reads the file at each request; a rename, so it never sees half of one.
        with open(self._control_file + ".tmp", "w") as f:
            json.dump(self._control, f)
        os.replace(self._control_file + ".tmp", self._control_file)

    def stop(self):
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)
