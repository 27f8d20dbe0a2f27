"""The parts of third-party libraries the gateway uses that they do not publish, each
library's in one module, checked against the installed version at start-up."""

from gateway.compat.aiohttp import IncompatibleAiohttp, check_aiohttp

__all__ = ["IncompatibleAiohttp", "check_aiohttp"]
