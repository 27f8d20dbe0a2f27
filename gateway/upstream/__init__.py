"""Adapters that speak each provider's API; one pooled session per backend."""

from gateway.upstream.anthropic import AnthropicUpstream
from gateway.upstream.openai import OpenAIUpstream, UpstreamFailure
from gateway.upstream.pool import UpstreamPool

__all__ = ["AnthropicUpstream", "OpenAIUpstream", "UpstreamFailure", "UpstreamPool"]
