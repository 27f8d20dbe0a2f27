"""Routing: pure, synchronous decisions about where a request runs."""
