"""OTLP/HTTP trace export requests POSTed over one kept-alive connection.

Used by the exporter process (`export_process.py`), where blocking is fine: it
serves nothing else. Honours what `OTEL_EXPORTER_OTLP_[TRACES_]*` set (resolved
by `tracing.py` into an `ExportConfig`): endpoint, headers, timeout, compression
and TLS files. Transient failures (connection errors, 408, 429, 502, 503, 504)
are retried with exponential backoff within the export timeout, as the SDK's
exporter does; anything else fails the batch at once.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import ssl
import time
import zlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

log = logging.getLogger("routegate.tracing.export")

_RETRYABLE = frozenset((408, 429, 502, 503, 504))
_FIRST_BACKOFF_S = 0.5
_GZIP_LEVEL = 6  # ~4x smaller OTLP at a fraction of level 9's CPU


@dataclass(frozen=True)
class ExportConfig:
    """Where and how the exporter process sends spans; plain values (pickled to it)."""

    endpoint: str  # the full traces URL, e.g. http://collector:4318/v1/traces
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    compression: str = "none"  # none | gzip | deflate
    certificate: str | None = None  # CA bundle for https
    client_certificate: str | None = None
    client_key: str | None = None


class OtlpPoster:
    """One connection to the collector, reopened after an error. Not thread-safe."""

    def __init__(self, config: ExportConfig) -> None:
        self.config = config
        url = urlsplit(config.endpoint)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._headers = {"Content-Type": "application/x-protobuf",
                         "User-Agent": "routegate-otlp-exporter", **config.headers}
        if config.compression in ("gzip", "deflate"):
            self._headers["Content-Encoding"] = config.compression
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            timeout = self.config.timeout_s
            if self._https:
                context = ssl.create_default_context(cafile=self.config.certificate)
                if self.config.client_certificate:
                    context.load_cert_chain(self.config.client_certificate,
                                            self.config.client_key)
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=context)
            else:
                self._connection = http.client.HTTPConnection(self._host, self._port,
                                                              timeout=timeout)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _body(self, data: bytes) -> bytes:
        if self.config.compression == "gzip":
            return gzip.compress(data, _GZIP_LEVEL)
        if self.config.compression == "deflate":
            return zlib.compress(data)
        return data

    def post(self, data: bytes) -> bool:
        """Send one ExportTraceServiceRequest; True once the collector accepted it."""
        body = self._body(data)
        deadline = time.monotonic() + self.config.timeout_s
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                connection = self._connect()
                connection.request("POST", self._path, body, self._headers)
                response = connection.getresponse()
                response.read()  # the whole reply, so the connection can be reused
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                status, problem = 0, f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= status < 300:
                    return True
                problem = f"HTTP {status}"
            if (status and status not in _RETRYABLE) or time.monotonic() + backoff > deadline:
                log.warning("trace export to %s failed (%s); %d bytes dropped",
                            self.config.endpoint, problem, len(data))
                return False
            time.sleep(backoff)
            backoff *= 2
