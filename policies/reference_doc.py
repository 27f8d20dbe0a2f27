"""`docs/policy.md`: the reference of every policy field, generated from the JSON Schema.

One section per object (the file itself, then each kind of object in the order the
file reaches it), one row per field: its type, default and description. The
descriptions are the strings under the fields in `schema.py`, so the reference, the
schema editors read and the code cannot disagree; a test keeps the committed file
equal to this output. Regenerate with `routegate policy reference > docs/policy.md`.
"""

from __future__ import annotations

import json
from typing import Any

from policies.json_schema import policy_json_schema

_ENV_PATTERN = r"\$\{[A-Za-z_][A-Za-z0-9_]*"
_HEADER = """\
# Policy file reference

Generated from the policy JSON Schema (`routegate policy reference > docs/policy.md`);
do not edit by hand. Every value may also be written as an environment reference,
`${VAR}`, `${VAR:-default}` or `${VAR:+word}`, resolved when the file loads. Unknown
keys are errors. `routegate policy check FILE` validates a file; editors validate as
you type with `# yaml-language-server: $schema=…/policies/policy.schema.json`.
"""


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return name.lower()


def _type(node: dict[str, Any]) -> str:
    """A field's type in a few words, objects linked to their section."""
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in node:
        forms = [form for form in node["anyOf"] if form.get("pattern") != _ENV_PATTERN]
        optional = any(form.get("type") == "null" for form in forms)
        words = [_type(form) for form in forms if form.get("type") != "null"]
        return " or ".join(words) + (" (optional)" if optional else "")
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"map of name → {_type(values)}" if isinstance(values, dict) else "object"
    if kind == "string" and node.get("format") == "password":
        return "string (secret)"
    bounds = [f"{sign} {node[key]}" for key, sign in
              (("exclusiveMinimum", ">"), ("minimum", "≥")) if key in node]
    return str(kind) + (f" ({', '.join(bounds)})" if bounds else "")


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in node:
        return ""
    default = node["default"]
    if default is None:
        return "none"
    if isinstance(default, dict) and len(json.dumps(default)) > 40:
        return "see its section"
    return f"`{json.dumps(default, ensure_ascii=False)}`"


def _section(name: str, node: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    description = node.get("description")
    if description:
        lines += [" ".join(description.split()), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    required = set(node.get("required", ()))
    for field, spec in node.get("properties", {}).items():
        text = " ".join(spec.get("description", "").split()).replace("|", "\\|")
        lines.append(f"| `{field}` | {_type(spec)} | {_default(spec, field in required)} "
                     f"| {text} |")
    return [*lines, ""]


def _references(node: Any) -> list[str]:
    """Object names a schema node refers to, in order of appearance."""
    if isinstance(node, dict):
        found = [_ref_name(node["$ref"])] if "$ref" in node else []
        for value in node.values():
            found += _references(value)
        return found
    if isinstance(node, list):
        return [name for item in node for name in _references(item)]
    return []


def render() -> str:
    schema = policy_json_schema()
    definitions: dict[str, Any] = schema["$defs"]
    order: list[str] = []
    pending = _references(schema["properties"])
    while pending:  # breadth first: an object's section follows the one that uses it
        name = pending.pop(0)
        if name not in order:
            order.append(name)
            pending += _references(definitions[name].get("properties", {}))
    top = {**schema, "description": "The top level of a policy file."}
    lines = [_HEADER, *_section("Policy file", top)]
    for name in order:
        lines += _section(name, definitions[name])
    return "\n".join(lines).rstrip() + "\n"
