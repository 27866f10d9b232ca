"""A real GCS API for tests and benchmarks (see service.py; `python -m tests.gcs` by hand)."""

from tests.gcs.service import GcsService

__all__ = ["GcsService"]
