"""Starts the test GCS API by hand, e.g. for a benchmark, and prints the env to use it.

    python -m tests.gcs [--latency_ms=50] [--bucket=ctl-test]

prints `export NAME=VALUE` lines (HTTPS_PROXY, CURL_CA_BUNDLE, ...) and serves on
127.0.0.1 until interrupted (Ctrl-C or SIGTERM); then `gs://BUCKET/...` works in any
process started with that env. From a script: start it with stdout on a pipe, read lines
up to the one starting with `#`, and apply the `export` lines before them.
"""

import argparse
import shlex
import signal
import threading

from tests.gcs.service import GcsService


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency_ms", type=int, default=0, help="added to every request")
    parser.add_argument("--bucket", default="ctl-test")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service = GcsService(bucket=args.bucket, latency_ms=args.latency_ms)
    try:
        for name, value in service.env().items():
            print(f"export {name}={shlex.quote(value)}")
        print(f"# gs://{args.bucket}/ is served ({args.latency_ms} ms a request); "
              "Ctrl-C to stop.", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        service.stop()


if __name__ == "__main__":
    main()
