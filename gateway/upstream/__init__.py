"""Adapters that speak each provider's API; one pooled session per backend."""

from gateway.core.failures import UpstreamFailure
from gateway.upstream.anthropic import AnthropicUpstream
from gateway.upstream.openai import OpenAIUpstream
from gateway.upstream.pool import UpstreamPool

__all__ = ["AnthropicUpstream", "OpenAIUpstream", "UpstreamFailure", "UpstreamPool"]
