"""Rate limits (RPM/TPM per tenant, key and route) and the spend ledger."""

from gateway.limits.failover import FailoverStore
from gateway.limits.ledger import periods_at
from gateway.limits.limiter import (
    BudgetExceeded,
    Limiter,
    LimitStoreUnavailable,
    RequestsLimitExceeded,
    Ticket,
    TokensLimitExceeded,
)
from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import (
    BudgetLimits,
    Charge,
    Decision,
    LimitStore,
    Reservation,
    Scope,
    StoreUnavailable,
)
from gateway.limits.wiring import open_store, store_url

__all__ = [
    "BudgetExceeded",
    "BudgetLimits",
    "Charge",
    "Decision",
    "FailoverStore",
    "LimitStore",
    "LimitStoreUnavailable",
    "Limiter",
    "MemoryStore",
    "RedisStore",
    "RequestsLimitExceeded",
    "Reservation",
    "Scope",
    "StoreUnavailable",
    "Ticket",
    "TokensLimitExceeded",
    "open_store",
    "periods_at",
    "store_url",
]
