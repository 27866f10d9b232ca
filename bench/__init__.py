"""ctl's benchmark suite: `python -m bench.run` (see bench/README.md)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
