"""Routing in the gateway: the hook that asks `routing.decide`, and what it learns from
the backends (their load, their health)."""
