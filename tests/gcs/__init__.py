"""A real GCS API for tests and benchmarks: gcp-storage-emulator as Google's hosts, on 127.0.0.1.

One process (emulator.py) is both the emulator and the HTTPS proxy TensorFlow's client is
pointed at: it answers TensorFlow's fixed endpoints (`www.googleapis.com`,
`storage.googleapis.com`) over TLS with a certificate of a test CA (tls/), and every other
host with a 502.

In the suite (tests/conftest.py): the session fixture `gcs` (one per test process) starts it
on a free port and sets `HTTPS_PROXY`, `CURL_CA_BUNDLE` (the test CA),
`GOOGLE_AUTH_TOKEN_FOR_TESTING`, `NO_GCE_CHECK=true` (and `NO_PROXY` for 127.0.0.1) in the
test process, so the processes a test starts inherit them; `gcs_dir` is a fresh
`gs://ctl-test/...` dir per test. `gcs.inject_faults` answers matching requests with an
error status (e.g. 503 for uploads), `gcs.set_latency(ms)` adds a round trip, and
`CTL_GCS_LATENCY_MS=50` adds one to the whole session.

By hand: `python -m tests.gcs --latency_ms=50` prints the `export` lines to use and serves
until Ctrl-C.

What the glue fixes for TensorFlow's client (chunked uploads that also carry a Content-Length,
empty `dir/` objects beside `dir/x`, resumable-upload `Location`s that must lead back over
https) is in emulator.py; tests/test_gcs.py checks gfile and a checkpoint there, and
tests/test_gcs_model_dir.py every mode of `ctl.run` (child processes reach it through the env).
"""

from tests.gcs.service import GcsService

__all__ = ["GcsService"]
