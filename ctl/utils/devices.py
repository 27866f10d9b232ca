"""TensorFlow's devices listed once at a command's start, without the CUDA wheel's noise on a host with no GPU.

TensorFlow's pip wheel is built with CUDA. On a Linux host with no CUDA driver
(no `libcuda.so.1`) it cannot use a GPU, yet the first listing of devices calls
`cuInit` through its stub and logs, at ERROR level:

    E external/local_xla/xla/stream_executor/cuda/cuda_platform.cc:51] failed call to cuInit: ...

`CUDA_VISIBLE_DEVICES=''` does not stop the call, and `TF_CPP_MIN_LOG_LEVEL=3`
would hide every real error too. `list_devices` lists the physical devices
(what TensorFlow does once per process anyway; no runtime is started, so
logical devices can still be configured after it) with file descriptor 2 going
to a temporary file, then writes back everything it logged but that one line.
On a host with a CUDA driver nothing is redirected: a `cuInit` failure there is
a real one.
"""

import ctypes
import os
import sys
import tempfile

NOISE = "failed call to cuInit"


def cuda_driver_present() -> bool:
    """Whether the CUDA driver library loads (False off Linux: TensorFlow's CUDA wheel is Linux's)."""
    if not sys.platform.startswith("linux"):
        return True  # Nothing to filter there.
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def list_devices() -> None:
    """Imports TensorFlow and lists its physical devices; on a Linux host with no CUDA driver,
    without the `cuInit` line (every other line TensorFlow writes meanwhile reaches stderr)."""
    if cuda_driver_present():
        import tensorflow as tf

        tf.config.list_physical_devices()
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:  # The import too: under absl's parsed flags, TensorFlow's import looks for GPUs.
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        kept = [line for line in captured.read().splitlines(keepends=True)
                if NOISE.encode() not in line]
    if kept:
        os.write(2, b"".join(kept))
