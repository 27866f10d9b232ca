"""ctl's benchmark suite: `python -m bench.run` (see docs/bench.md)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
