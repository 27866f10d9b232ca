"""ctl's benchmark suite: `python -m bench.run` (see docs/bench.md)."""
