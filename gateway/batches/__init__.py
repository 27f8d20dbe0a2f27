"""The Batch API: files, batches, and the runner that fills spare dedicated capacity
with batch lines and spills to shared targets as a batch's window closes."""

from gateway.batches.http import BATCHES
from gateway.batches.install import install
from gateway.batches.service import BatchService

__all__ = ["BATCHES", "BatchService", "install"]
