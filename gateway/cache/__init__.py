from gateway.cache.http import RESPONSE_CACHE, install
from gateway.cache.response_cache import ResponseCache

__all__ = ["RESPONSE_CACHE", "ResponseCache", "install"]
