"""TLS contexts for backend connections: one per trust store, shared, built off the loop.

`ssl.create_default_context()` reads the system's CA store, about 20 ms; built per
backend client it stalled the event loop on each https backend's first request and
again after every reload that touched the backend. A context is safe to share, so
every backend trusting the same CAs uses one, made once; `warm()` makes the ones a
policy needs in a worker thread at start-up and after each reload, before any
request asks. A `ca_file` is keyed by its path and modification time, so a rotated
bundle is read again by the next client built after the change; a reload (even of an
unchanged policy: SIGHUP after rotating a bundle) retires the clients built on the old
one (`UpstreamPool.follow`).
"""

from __future__ import annotations

import os
import ssl
import threading

from policies.load import Policy

_Key = tuple[str, int] | None  # (path, mtime in ns) of a CA bundle; None: the system's

_contexts: dict[_Key, ssl.SSLContext] = {}
_lock = threading.Lock()  # warm() runs in a worker thread


def _key(ca_file: str | None) -> _Key:
    return None if ca_file is None else (ca_file, os.stat(ca_file).st_mtime_ns)


def ca_stamp(ca_file: str) -> _Key:
    """What identifies `ca_file` as it is now (None when it cannot be read)."""
    try:
        return _key(ca_file)
    except OSError:
        return None


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The shared context trusting `ca_file` (a PEM bundle), else the system's CAs."""
    key = _key(ca_file)
    context = _contexts.get(key)
    if context is None:
        with _lock:
            context = _contexts.get(key)
            if context is None:
                context = _contexts[key] = ssl.create_default_context(cafile=ca_file)
    return context


def warm(policy: Policy) -> None:
    """Build the contexts `policy`'s https backends use (blocking: call in a thread).
    A CA file that went missing or bad since the policy loaded is left for the
    backend's first request to report."""
    for backend in policy.file.backends.values():
        if backend.enabled and (backend.url or "").startswith("https://"):
            try:
                tls_context(backend.ca_file)
            except (OSError, ssl.SSLError):
                continue


def is_ready(ca_file: str | None = None) -> bool:
    """Whether the context for `ca_file` (as the file is now) is built: no request
    will wait for it."""
    try:
        return _key(ca_file) in _contexts
    except OSError:
        return False
