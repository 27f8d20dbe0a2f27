"""The JSON Schema of policy files, for editors (`# yaml-language-server: $schema=…`).

`policies/policy.schema.json` is this output, committed so editors find it
next to the YAML; a test keeps the two equal. Regenerate with
`routegate policy schema > policies/policy.schema.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from policies.schema import PolicyFile

SCHEMA_PATH = Path(__file__).with_name("policy.schema.json")
SCHEMA_ID = "https://routegate.dev/policy.schema.json"
# Any value may come from the environment; an editor must not flag `${GPU_PRICE}`
# where a number is expected.
_ENV_REFERENCE = {"type": "string", "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*"}
_SCALAR_TYPES = {"boolean", "integer", "number"}


def _allow_env_references(node: Any) -> Any:
    if isinstance(node, list):
        return [_allow_env_references(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _allow_env_references(value) for key, value in node.items()}
    kind = node.get("type")
    if (isinstance(kind, str) and kind in _SCALAR_TYPES) or (
            isinstance(node.get("enum"), list)) or "const" in node or (
            kind == "string" and "pattern" in node):
        # what an editor shows on hover belongs to the field, not to one of its forms
        outer = {key: node.pop(key) for key in ("title", "description", "default")
                 if node.get(key) is not None}
        return {"anyOf": [node, _ENV_REFERENCE], **outer}
    return node


def policy_json_schema() -> dict[str, Any]:
    schema = _allow_env_references(PolicyFile.model_json_schema())
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
              **schema}
    schema["title"] = "routegate policy file"
    result: dict[str, Any] = schema
    return result


def render() -> str:
    return json.dumps(policy_json_schema(), indent=2, sort_keys=False) + "\n"
