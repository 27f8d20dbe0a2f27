"""Policy files: the schema ops write, and the loader that validates it."""

from policies.load import ModelTarget, Policy, PolicyError, load, loads
from policies.schema import PolicyFile

__all__ = ["ModelTarget", "Policy", "PolicyError", "PolicyFile", "load", "loads"]
