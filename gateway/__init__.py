"""The gateway: all the I/O — HTTP API, auth, limits, queues, upstreams, telemetry."""
