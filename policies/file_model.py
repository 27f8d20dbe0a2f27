"""What every policy file model shares: frozen, no unknown keys, and the string under
a field as its description; the constrained value types the models are made of."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

KEY_HASH_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
TARGET_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+/[^/\s]+.*$")

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


def _check_target(target: str) -> str:
    if not TARGET_PATTERN.match(target):
        raise ValueError(f"target {target!r} must be written as backend/model")
    return target


def _check_key_hash(key: str) -> str:
    # The value is not echoed: a plain key pasted here by mistake is a secret.
    if not KEY_HASH_PATTERN.match(key):
        raise ValueError(
            "api_keys hold sha256:<64 hex> hashes, never plain keys (make a key and its "
            "hash with `routegate keys new`, or hash an existing key with `routegate keys "
            "hash`, which reads it from standard input and keeps it out of shell history)"
        )
    return key


# Validated one by one, so an error names the list item (`routes.chat.targets[2]`).
# The pattern is for the JSON Schema only (editors flag what the loader refuses); the
# validator gives the error its wording.
Target = Annotated[str, AfterValidator(_check_target),
                   Field(json_schema_extra={"pattern": TARGET_PATTERN.pattern})]
KeyHash = Annotated[str, AfterValidator(_check_key_hash),
                    Field(json_schema_extra={"pattern": KEY_HASH_PATTERN.pattern})]


class FileModel(BaseModel):
    # a string under a field is its description: JSON Schema hover help, docs/policy.md
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
