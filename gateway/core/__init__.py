"""The vocabulary every part of the gateway shares, and the floor everything else stands on.

Errors, the request record and its writers, timings and the deadline, the request
context (live objects only), identity and authentication, the live policy, the hook
protocols, the response type that writes whole bodies. It imports nothing of the
gateway above it (import-linter checks the floors: see `.importlinter`).
"""
