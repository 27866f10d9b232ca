"""gcp-storage-emulator's server, with what TensorFlow's `gs://` filesystem needs.

Run as `python -m tests.gcs.emulator BUCKET`: serves on a free port of 127.0.0.1,
prints `port=N` on stdout once it listens, and runs until it is terminated.

What the emulator lacks, added here (a wrapper, not an edit of the installed package,
so a fresh install behaves the same):
- Empty uploads: the emulator reads an empty body as "no body" and fails on it; a
  media upload's empty body is an empty object here.
- On disk the emulator keeps one file per object, and a directory marker `a/` and an
  object `a/b` cannot both be files there: storage is kept in memory instead.
- One request at a time (the emulator's storage is a dict it rewrites whole), each on
  its own connection (HTTP/1.0), so a slow client never holds up another's request
  behind a kept-alive socket.
"""

import re
import sys
import tempfile
from functools import partial
from http import server

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.handlers import buckets
from gcp_storage_emulator.storage import Storage

class _Request(emulator.Request):
    @property
    def data(self):
        data = super().data
        if data is None and self.query.get("uploadType") == ["media"]:
            return b""
        return data


def serve(bucket: str):
    emulator.Request = _Request
    storage = Storage(use_memory_fs=True, data_dir=tempfile.gettempdir())  # Memory only.
    buckets.create_bucket(bucket, storage)
    httpd = server.HTTPServer(("127.0.0.1", 0), partial(emulator.RequestHandler, storage))
    print(f"port={httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not re.fullmatch(r"[-.\w]+", sys.argv[1]):
        sys.exit("usage: python -m tests.gcs.emulator BUCKET")
    serve(sys.argv[1])
