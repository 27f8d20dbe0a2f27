"""YAML text → plain data, keeping where every value was written.

The file is composed into PyYAML's node tree first, so every value keeps its
line and column. `${VAR}` references are then resolved inside scalar nodes,
never in the text: a substituted value can never shift the position of
anything else, references in comments are ignored, and a secret never passes
through the YAML parser's error messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from policies.errors import PolicyIssue
from policies.yaml_syntax import syntax_issue

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\+)([^}\n]*))?\}")
# While the YAML is parsed, each reference stands in as a placeholder of the same
# length (`${A}` → `¤0¤¤`, ¤ a private-use character the file does not contain, so
# no text the author wrote can be taken for one): `{` and `}` would otherwise end a
# flow mapping early, and equal lengths keep every line and column where the author
# wrote it (up to 1,296 references; past that a one-letter `${A}` grows by a column).
_PRIVATE_USE = range(0xE000, 0xF900)
_STR_TAG = "tag:yaml.org,2002:str"
# LibYAML's parser when PyYAML was built with it (several times faster); same node marks.
_COMPOSER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader)

Segment = str | int


@dataclass(frozen=True, slots=True)
class Place:
    """Where a field path points in the file (1-based), and the path as written."""

    line: int | None
    column: int | None
    field_path: str


def render_path(path: Sequence[Segment]) -> str:
    """`("routes", "chat", "targets", 2)` → `routes.chat.targets[2]`."""
    text = ""
    for segment in path:
        if isinstance(segment, int):
            text += f"[{segment}]"
        else:
            text += f".{segment}" if text else str(segment)
    return text


def substitute(value: str, environ: Mapping[str, str]) -> tuple[str, list[tuple[int, str]]]:
    """Shell-style `${VAR}`, `${VAR:-default}`, `${VAR:+word}`.

    Returns the new value and (offset, name) for each variable that is unset
    and has no default.
    """
    missing: list[tuple[int, str]] = []

    def replace(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        current = environ.get(name)
        if operator == ":-":
            return current if current else (argument or "")
        if operator == ":+":
            return (argument or "") if current else ""
        if current is None:
            missing.append((match.start(), name))
            return ""
        return current

    return _ENV_REFERENCE.sub(replace, value), missing


def unresolvable(value: str) -> list[int]:
    """Offsets of each `${` in `value` that begins none of the three reference forms
    (`${VAR-x}`, `${ VAR }`, one nested in a default)."""
    starts = {match.start() for match in _ENV_REFERENCE.finditer(value)}
    return [match.start() for match in re.finditer(r"\$\{", value) if match.start() not in starts]


class LocatedDocument:
    """A composed YAML document: its plain data and a map back to line and column."""

    def __init__(self, root: yaml.Node, source: str) -> None:
        self.root = root
        self.source = source
        self._resolver = yaml.resolver.Resolver()

    @classmethod
    def compose(cls, text: str, *, source: str, environ: Mapping[str, str]
                ) -> tuple[LocatedDocument | None, list[PolicyIssue]]:
        """Parse and interpolate; the document is None when the YAML itself is broken."""
        references: list[str] = []
        marker = next((chr(code) for code in _PRIVATE_USE if chr(code) not in text), "\uf8ff")

        def hide(match: re.Match[str]) -> str:
            references.append(match.group(0))
            token = f"{marker}{_base36(len(references) - 1)}{marker}"
            return token.ljust(len(match.group(0)), marker)

        try:
            root = yaml.compose(_ENV_REFERENCE.sub(hide, text), Loader=_COMPOSER)
        except yaml.YAMLError as exc:
            return None, [syntax_issue(exc, text, source)]
        if root is None:
            return None, [PolicyIssue("the policy file is empty", source, 1, 1)]
        document = cls(root, source)
        if references:
            placeholder = re.compile(f"{marker}([0-9a-z]+){marker}+")
            document._restore(root, references, placeholder, marker)
        issues = document._check_duplicate_keys(root)
        issues += document._interpolate(root, environ, ())
        return document, issues

    def data(self) -> object:
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_document(self.root)
        finally:
            loader.dispose()

    # -- locating ---------------------------------------------------------------

    def walk(self, path: Sequence[Segment]
             ) -> tuple[yaml.Node | None, yaml.Node, list[Segment]]:
        """Follow `path` as far as the file has it: (key node, value node, matched path)."""
        key_node: yaml.Node | None = None
        node = self.root
        matched: list[Segment] = []
        for segment in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value == str(segment):
                        key_node, node = key, value
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(segment, int):
                if not 0 <= segment < len(node.value):
                    break
                key_node, node = None, node.value[segment]
            else:
                break
            matched.append(segment)
        return key_node, node, matched

    def place(self, path: Sequence[Segment], *, at_key: bool = False,
              missing: bool = False) -> Place:
        """Where to point for an error about `path`.

        `at_key`: the key itself is wrong (unknown key), point at the key.
        `missing`: the last segment is absent, point at the mapping that lacks it.
        Segments the file does not have (pydantic's union branch names) are
        dropped from the rendered path.
        """
        key_node, node, matched = self.walk(path)
        shown = list(matched)
        if missing and path and len(matched) == len(path) - 1:
            shown.append(path[-1])
        # An error about a whole mapping or list (too short, inconsistent) points at its key.
        whole = isinstance(node, yaml.MappingNode | yaml.SequenceNode) and len(matched) == len(path)
        mark_node = key_node if (at_key or missing or whole) and key_node is not None else node
        mark = mark_node.start_mark
        return Place(mark.line + 1, mark.column + 1, render_path(shown))

    # -- passes over the node tree ------------------------------------------------

    def _restore(self, node: yaml.Node, references: list[str], placeholder: re.Pattern[str],
                 marker: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                self._restore(key, references, placeholder, marker)
                self._restore(value, references, placeholder, marker)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                self._restore(item, references, placeholder, marker)
        elif isinstance(node, yaml.ScalarNode) and marker in node.value:
            node.value = placeholder.sub(
                lambda match: references[int(match.group(1), 36)], node.value)

    def _check_duplicate_keys(self, node: yaml.Node) -> list[PolicyIssue]:
        issues: list[PolicyIssue] = []
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        first = seen[key.value].start_mark.line + 1
                        issues.append(PolicyIssue(
                            f"duplicate key `{key.value}` (first written on line {first})",
                            self.source, key.start_mark.line + 1, key.start_mark.column + 1,
                        ))
                    else:
                        seen[key.value] = key
                issues += self._check_duplicate_keys(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                issues += self._check_duplicate_keys(item)
        return issues

    def _interpolate(self, node: yaml.Node, environ: Mapping[str, str],
                     path: tuple[Segment, ...]) -> list[PolicyIssue]:
        issues: list[PolicyIssue] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                issues += self._interpolate(value, environ, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                issues += self._interpolate(item, environ, (*path, index))
        elif isinstance(node, yaml.ScalarNode) and "${" in node.value:
            value, missing = substitute(node.value, environ)
            start = node.start_mark
            single_line = start.line == node.end_mark.line
            opening = 1 if node.style in ("'", '"') else 0

            def column(offset: int) -> int:
                return start.column + 1 + opening + offset if single_line else start.column + 1

            for offset in unresolvable(node.value):
                # Kept as text it would reach the backend (as its API key, its URL).
                issues.append(PolicyIssue(
                    "`${` starts no reference: write ${VAR}, ${VAR:-default} or "
                    "${VAR:+word} (a default cannot hold another reference)", self.source,
                    start.line + 1, column(offset), render_path(path)))
            for offset, name in missing:
                issues.append(PolicyIssue(
                    f"environment variable {name} is not set", self.source,
                    start.line + 1, column(offset), render_path(path),
                    hint=f"set {name}, or write ${{{name}:-default}}",
                ))
            if node.style is None and node.tag == _STR_TAG:
                # A plain scalar means what its value says once substituted:
                # `${PORT}` → 8080 is an int, `${FLAG:+true}` → true is a bool.
                node.tag = self._resolver.resolve(yaml.ScalarNode, value, (True, False))
            node.value = value
        return issues


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, remainder = divmod(number, 36)
        text = digits[remainder] + text
        if number == 0:
            return text
