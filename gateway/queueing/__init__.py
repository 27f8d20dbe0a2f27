"""Per-backend queues: concurrency slots, priority bands, deadlines, fair share, shedding."""

from gateway.queueing.clock import Clock, MonotonicClock, TimerHandle
from gateway.queueing.errors import (
    Evicted,
    QueueDeadlinePassed,
    QueueFull,
    QueueRejected,
    WouldMissDeadline,
)
from gateway.queueing.queues import BackendQueues, QueueSnapshot
from gateway.queueing.shedding import ShedPolicy
from gateway.queueing.slots import Acquisition, QueueCounters, SlotTicket
from policies.bands import PRIORITIES, Priority

__all__ = [
    "PRIORITIES",
    "Acquisition",
    "BackendQueues",
    "Clock",
    "Evicted",
    "MonotonicClock",
    "Priority",
    "QueueCounters",
    "QueueDeadlinePassed",
    "QueueFull",
    "QueueRejected",
    "QueueSnapshot",
    "ShedPolicy",
    "SlotTicket",
    "TimerHandle",
    "WouldMissDeadline",
]
