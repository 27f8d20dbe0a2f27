"""Policy files: the schema ops write, and the loader that validates it."""

from policies.dump import dump
from policies.errors import PolicyError, PolicyIssue
from policies.keys import hash_key, new_key
from policies.load import ModelTarget, Policy, build, load, loads, parse
from policies.schema import PolicyFile

__all__ = [
    "ModelTarget",
    "Policy",
    "PolicyError",
    "PolicyFile",
    "PolicyIssue",
    "build",
    "dump",
    "hash_key",
    "load",
    "loads",
    "new_key",
    "parse",
]
