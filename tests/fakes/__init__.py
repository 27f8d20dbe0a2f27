"""Reusable stand-ins for the world outside the gateway (upstream providers, children)."""
