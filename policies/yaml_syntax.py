"""A YAML syntax error, located where the mistake is and said in the author's terms.

PyYAML reports where its scanner gave up, which is often a line after the mistake
(a missing `:` or `}` surfaces on the next line, an unclosed quote at the end of the
file) and in its own vocabulary ("found character that cannot start any token"). The
common mistakes are recognised here and moved back to the line that has them, with
the fix as a hint; anything else keeps PyYAML's words and place.
"""

from __future__ import annotations

import yaml

from policies.errors import PolicyIssue


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _previous_content_line(lines: list[str], index: int) -> int | None:
    for before in range(index - 1, -1, -1):
        stripped = lines[before].strip()
        if stripped and not stripped.startswith("#"):
            return before
    return None


def syntax_issue(exc: yaml.YAMLError, text: str, source: str) -> PolicyIssue:
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None) or ""
    mark = getattr(exc, "problem_mark", None)
    opened = getattr(exc, "context_mark", None)
    if mark is None:
        return PolicyIssue(f"not valid YAML: {problem}", source)
    lines = text.splitlines() or [""]
    index = min(mark.line, len(lines) - 1)
    line = lines[index]

    def issue(message: str, at_line: int, column: int, hint: str | None) -> PolicyIssue:
        return PolicyIssue(f"not valid YAML: {message}", source, at_line + 1, column + 1,
                           hint=hint)

    leading = line[:len(line) - len(line.lstrip(" \t"))]
    if "\t" in leading:
        return issue("a tab indents this line; YAML indents with spaces only", index,
                     leading.index("\t"), "replace the tab with spaces")
    if "quoted scalar" in context and opened is not None:
        quote = lines[opened.line][opened.column] if opened.line < len(lines) else '"'
        return issue(f"the {quote} opened here is never closed", opened.line, opened.column,
                     f"close the value with {quote}")
    if ("flow mapping" in context or "flow sequence" in context) and opened is not None:
        bracket, closing = ("{", "}") if "mapping" in context else ("[", "]")
        return issue(f"the `{bracket}` opened here is never closed", opened.line,
                     opened.column, f"close it with `{closing}` before the line ends")
    if "mapping values are not allowed" in problem:
        before = _previous_content_line(lines, index)
        if before is not None and _indent(lines[before]) == _indent(line) and (
                ":" not in lines[before]):
            # `type openai` then `url: …`: the line without its colon is the mistake
            return issue("this line has no `:` after its key", before, _indent(lines[before]),
                         "write `key: value`")
        if before is not None and _indent(line) > _indent(lines[before]):
            key = lines[before].strip().split(":", 1)[0]
            return issue(f"this key is indented deeper than `{key}` above it, so it reads "
                         "as part of that value", index, _indent(line),
                         f"indent it as `{key}` is ({_indent(lines[before])} spaces)")
    if problem.startswith(("did not find expected key", "expected <block end>")):
        before = _previous_content_line(lines, index)
        hint = ("indent it as the keys around it are" if before is None else
                f"indent it as the line above is ({_indent(lines[before])} spaces)")
        return issue(f"this line is indented {_indent(line)} spaces, which matches no key "
                     "above it", index, _indent(line), hint)
    if "cannot start any token" in problem and line[mark.column:mark.column + 1] in "@`":
        return issue(f"a plain value cannot start with `{line[mark.column]}`", index,
                     mark.column, "quote the value")
    return issue(problem, index, mark.column, None)
