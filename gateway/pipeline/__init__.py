"""The one path every proxied request takes (`steps.py`), the context it runs on and
the record it fills (`record.py`)."""

from gateway.pipeline.record import AttemptRecord, RequestRecord, StepRecord, TraceIds

__all__ = ["AttemptRecord", "RequestRecord", "StepRecord", "TraceIds"]
