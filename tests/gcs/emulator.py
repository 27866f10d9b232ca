"""gcp-storage-emulator's server as Google's storage hosts, for TensorFlow's `gs://`.

Run as `python -m tests.gcs.emulator BUCKET CONTROL_FILE [LATENCY_MS]`: serves on a free
port of 127.0.0.1, prints `port=N` on stdout once it listens, and runs until terminated.

The port is an HTTPS proxy (TensorFlow's client honours HTTPS_PROXY and CURL_CA_BUNDLE):
a `CONNECT` to one of Google's storage or auth hosts is answered here, over TLS with the
test certificate in tls/ (a test CA, `tls/ca.pem`, signed it for those host names; no
other certificate trusts it). The emulator's storage answers the storage hosts, a fixed
token answers the auth hosts, and every other host gets a 502: nothing leaves 127.0.0.1.

The control file (JSON, written by `GcsService`, read at each request) holds
`latency_ms`, added before every request is answered, and `faults`: the first rule that
matches a request holds it for the rule's `delay_ms`, then answers it with the rule's
`status`, if it has one (see `GcsService.inject_faults`); and `log`, a file each request
is appended to as one JSON line once answered (`GcsService.log_requests`).

What the emulator lacks, added here (a wrapper, not an edit of the installed package,
so a fresh install behaves the same):
- Empty uploads: the emulator reads an empty body as "no body" and fails on it; a
  media upload's empty body is an empty object here.
- TensorFlow sends uploads with both `Transfer-Encoding: chunked` and a Content-Length:
  the body is read here (chunked wins) and handed on whole.
- A resumable upload's session URL (`Location`) must lead back over https.
- On disk the emulator keeps one file per object, and a directory marker `a/` and an
  object `a/b` cannot both be files there: storage is kept in memory instead, and the
  emulator's copy of all metadata, rewritten as JSON after each change for a restart to
  read back, is not kept (nothing restarts it; the copy grew with the session and took a
  quarter of the service's CPU).
- Deletes are final (the bucket's soft-delete retention is 0), as a test bucket's would
  be: a deleted object is neither listed nor served either way.
- One storage request at a time (the emulator's storage is a dict it rewrites whole);
  each connection has a thread, so latency, a held request or a slow client holds up
  only its own connection.

The certificate (ECDSA P-256, valid until 2126) was made with openssl: a self-signed CA
(`basicConstraints=critical,CA:TRUE`), then a server key and certificate for the host
names in `_STORAGE_HOSTS` and `_AUTH_HOSTS` signed by it. The CA's key was not kept.
"""

import io
import json
import os
import re
import ssl
import sys
import tempfile
import threading
import time
from functools import partial
from http import server

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.handlers import buckets
from gcp_storage_emulator.storage import Storage

_TLS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tls")
_STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
_AUTH_HOSTS = ("oauth2.googleapis.com", "accounts.google.com")
_IDLE_CONNECTION_S = 120  # A kept-alive connection's thread ends after this long idle.


class _Request(emulator.Request):
    @property
    def data(self):
        data = super().data
        if data is None and self.query.get("uploadType") == ["media"]:
            return b""
        return data


class _Handler(emulator.RequestHandler):
    """One client connection: a `CONNECT` tunnel, then the requests inside it."""

    protocol_version = "HTTP/1.1"  # Keep-alive inside a tunnel; every answer has a length.
    timeout = _IDLE_CONNECTION_S
    disable_nagle_algorithm = True  # Headers and body go out as two writes: no 40 ms wait.

    def __init__(self, storage, settings, *args, **kwargs):
        self.settings = settings
        self.tunnel_host = None
        super().__init__(storage, *args, **kwargs)

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        if host not in _STORAGE_HOSTS + _AUTH_HOSTS:
            self.close_connection = True
            self._answer(502, {"error": f"{host} is not served here"})
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.connection = self.settings.tls.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb")
        self.wfile = _Unbuffered(self.connection)
        self.tunnel_host = host

    def finish(self):
        super().finish()
        if self.tunnel_host is not None:
            self.connection.close()  # The server closes only the socket it accepted.

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def do_PATCH(self):
        self._serve("PATCH")

    def do_DELETE(self):
        self._serve("DELETE")

    def _serve(self, method):
        started = time.time()
        control = self.settings.control()
        try:
            self._answer_request(method, control)
        finally:
            if control.get("log"):
                _log(control["log"], {"start": started, "end": time.time(), "method": method,
                                      "host": self.tunnel_host, "path": self.path})

    def _answer_request(self, method, control):
        body = self._read_body()
        latency_ms = control.get("latency_ms", self.settings.latency_ms)
        if latency_ms:
            time.sleep(latency_ms / 1000)
        if self.tunnel_host in _AUTH_HOSTS:
            self._answer(200, {"access_token": "test-token", "token_type": "Bearer",
                               "expires_in": 3600})
            return
        if self.tunnel_host not in _STORAGE_HOSTS:
            self._answer(502, {"error": "use this port as an HTTPS proxy"})
            return
        fault = _matching_fault(control.get("faults", ()), method, self.path)
        if fault is not None and fault.get("delay_ms"):
            time.sleep(fault["delay_ms"] / 1000)
        if fault is not None and fault.get("status"):
            self._answer(fault["status"], {"error": {"code": fault["status"],
                                                     "message": "injected by the test"}})
            return
        del self.headers["Transfer-Encoding"]
        del self.headers["Content-Length"]
        self.headers["Content-Length"] = str(len(body))
        connection_rfile, self.rfile = self.rfile, io.BytesIO(body)
        try:
            with self.settings.storage_lock:
                emulator.Router(self).handle(method)
        except Exception as error:  # The emulator failed: a bad gateway, as a proxy says.
            self._answer(502, {"error": f"the emulator failed: {error!r}"})
        finally:
            self.rfile = connection_rfile

    def _read_body(self) -> bytes:
        """The request's whole body: chunked when it says so, else by its Content-Length."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # Trailers.
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_header(self, keyword, value):
        if keyword.lower() == "location" and value.startswith("http://"):
            value = "https://" + value[len("http://"):]
        super().send_header(keyword, value)

    def _answer(self, status, payload):
        content = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)


class _Unbuffered(io.RawIOBase):
    """Writes straight to the socket, as the server's own writer does: an interim
    `100 Continue` must reach the client before the body it waits to send."""

    def __init__(self, sock):
        super().__init__()
        self._sock = sock

    def writable(self):
        return True

    def write(self, data):
        self._sock.sendall(data)
        return len(data)


_LOG_LOCK = threading.Lock()


def _log(path: str, record: dict) -> None:
    with _LOG_LOCK, open(path, "a") as log:
        log.write(json.dumps(record) + "\n")


def _matching_fault(rules, method, path):
    """The first of `rules` that matches the request, or None."""
    for rule in rules:
        if rule.get("methods") and method not in rule["methods"]:
            continue
        if rule.get("path_contains", "") not in path:
            continue
        return rule
    return None


class _Settings:
    """What every connection shares: TLS, the storage lock, latency and the control file."""

    def __init__(self, control_file: str, latency_ms: int):
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(os.path.join(_TLS_DIR, "server.pem"),
                                 os.path.join(_TLS_DIR, "server.key"))
        self.storage_lock = threading.Lock()
        self.latency_ms = latency_ms
        self._control_file = control_file

    def control(self) -> dict:
        """The control file's settings; {} when there is none."""
        try:
            with open(self._control_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


class _Server(server.ThreadingHTTPServer):
    request_queue_size = 128  # Many clients connect at once in a cluster test.


class _MemoryStorage(Storage):
    def _write_config_to_file(self):
        pass  # Only a restart reads it (see the module's docstring).


def serve(bucket: str, control_file: str, latency_ms: int = 0):
    emulator.Request = _Request
    storage = _MemoryStorage(use_memory_fs=True, data_dir=tempfile.gettempdir())
    buckets.create_bucket(bucket, storage)
    storage.buckets[bucket]["softDeletePolicy"] = {"retentionDurationSeconds": 0}
    settings = _Settings(control_file, latency_ms)
    httpd = _Server(("127.0.0.1", 0), partial(_Handler, storage, settings))
    print(f"port={httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or not re.fullmatch(r"[-.\w]+", sys.argv[1]):
        sys.exit("usage: python -m tests.gcs.emulator BUCKET CONTROL_FILE [LATENCY_MS]")
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 0)
