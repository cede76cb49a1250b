"""Reading the YAML/JSON files people write (host descriptions, recipes): every way such a file can be
broken is one line that names the file and, where there is one, the line."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserInputError


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def parse(text: str, path: str | Path, *, as_json: bool = False) -> object:
    """YAML (or JSON) -> Python, with syntax errors as 'FILE:LINE: invalid YAML: ...; fix ...'."""
    import yaml

    try:
        return json.loads(text) if as_json else yaml.safe_load(text)
    except RecursionError:
        raise UserInputError(f"{path}: nested too deeply; fix the brackets") from None
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}; fix the syntax on that line") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError(f"{where}: invalid YAML: {problem}; fix the syntax on that line") from None


def key_lines(text: str) -> dict[str, int]:
    """'gpus.memory' -> 1-based line, so errors can point into the file."""
    import yaml

    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                dotted = f"{prefix}{key_node.value}"
                lines[dotted] = key_node.start_mark.line + 1
                walk(value_node, dotted + ".")

    with contextlib.suppress(yaml.YAMLError, RecursionError):  # the parser reports syntax errors, with lines
        walk(yaml.compose(text), "")
    return lines


# ------------------------------------------------------------------------------------------ JSON documents


@dataclass(frozen=True)
class DuplicateKey:
    """A key an object sets twice: json.loads keeps the last silently; DeepSpeed refuses the file."""

    path: str  # the repeated key's path, such as "zero_optimization" or "zero_optimization.stage"
    lines: tuple[int, int]  # 1-based lines of the first and the repeated occurrence

    @property
    def where(self) -> str:
        """'lines 4 and 6', or 'twice on line 5'."""
        first, second = self.lines
        return f"twice on line {first}" if first == second else f"lines {first} and {second}"

    def __str__(self) -> str:
        return f"duplicate key '{_printable(self.path)}' ({self.where})"


@dataclass(frozen=True)
class JsonDocument:
    value: object
    duplicates: tuple[DuplicateKey, ...]  # every repeated key, at any depth, in file order


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]', re.S)  # strings and punctuation; numbers etc. skipped
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(text: str, path: str | Path, *, max_depth: int) -> JsonDocument:
    """JSON -> Python like `parse(as_json=True)`, and also: the keys set twice (with their lines), nesting
    deeper than `max_depth` and strings holding half a UTF-16 surrogate pair as one-line errors (the code
    after the read, and the terminal, handle neither)."""
    repeated = False

    # DeepSpeed reads a config file with (deepspeed/runtime/config.py, DeepSpeedConfig.__init__)
    #     hjson.load(open(config, "r"), object_pairs_hook=dict_raise_error_on_duplicate_keys)
    # and deepspeed/runtime/config_utils.py:
    #     def dict_raise_error_on_duplicate_keys(ordered_pairs):
    #         """Reject duplicate keys."""
    #         d = dict((k, v) for k, v in ordered_pairs)
    #         if len(d) != len(ordered_pairs):
    #             counter = collections.Counter([pair[0] for pair in ordered_pairs])
    #             keys = [key for key, value in counter.items() if value > 1]
    #             raise ValueError("Duplicate keys in DeepSpeed config: {}".format(keys))
    #         return d
    # The same hook here notes that some object repeats a key; a second pass over the text then finds which
    # key, its path and both lines (a hook sees neither).
    def pairs_hook(pairs: list[tuple[str, object]]) -> dict:
        nonlocal repeated
        d = dict(pairs)
        repeated = repeated or len(d) != len(pairs)
        return d

    try:
        value = json.loads(text, object_pairs_hook=pairs_hook)
    except RecursionError:
        raise UserInputError(f"{path}: nested deeper than {max_depth} levels; fix the brackets") from None
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}; fix the syntax on that line") from None
    duplicates: list[DuplicateKey] = []
    too_deep = _depth(value) > max_depth
    if repeated or too_deep:
        duplicates, deep_line = _scan(text, max_depth)
        if too_deep:
            at = f"{path}:{deep_line}" if deep_line is not None else str(path)
            raise UserInputError(f"{at}: nested deeper than {max_depth} levels; fix the brackets")
    if _SURROGATE_ESCAPE.search(text):
        line = _lone_surrogate_line(text)
        if line is not None:
            raise UserInputError(
                f"{path}:{line}: invalid JSON: a \\uD800-\\uDFFF escape without its other half is no character; "
                "write the character itself or its full surrogate pair"
            )
    return JsonDocument(value, tuple(duplicates))


def _depth(value: object) -> int:
    """How many objects/arrays deep `value` nests ({} is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _scan(text: str, max_depth: int) -> tuple[list[DuplicateKey], int | None]:
    """Over valid JSON text: every repeated key (path, first line, repeated line), and the line where the
    nesting first goes deeper than `max_depth` (None if it never does). Iterative: no depth limit of its own."""
    duplicates: list[DuplicateKey] = []
    deep_line: int | None = None
    # one frame per open container: [path, seen keys -> line (None for an array), current key or index]
    stack: list[list] = []
    expect_key = False
    line, last = 1, 0
    for match in _JSON_TOKEN.finditer(text):
        token, start = match.group(), match.start()
        line += text.count("\n", last, start)
        last = start
        if token in ("{", "["):
            parent = stack[-1] if stack else None
            path = (*parent[0], parent[2]) if parent else ()
            stack.append([path, {} if token == "{" else None, None if token == "{" else 0])
            expect_key = token == "{"
            if len(stack) > max_depth and deep_line is None:
                deep_line = line
        elif token in ("}", "]"):
            stack.pop()
            expect_key = False
        elif token == ",":
            if stack[-1][1] is None:
                stack[-1][2] += 1
            else:
                expect_key = True
        elif token != ":" and expect_key:
            frame, key = stack[-1], json.loads(token)
            if key in frame[1]:
                duplicates.append(DuplicateKey(_dotted((*frame[0], key)), (frame[1][key], line)))
            else:
                frame[1][key] = line
            frame[2], expect_key = key, False
    return duplicates, deep_line


def _dotted(parts: tuple) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _lone_surrogate_line(text: str) -> int | None:
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token.startswith('"') and "\\u" in token and any("\ud800" <= c <= "\udfff" for c in json.loads(token)):
            return text.count("\n", 0, match.start()) + 1
    return None


def _printable(text: str) -> str:
    """`text` for a one-line message: as it is when printable, else its repr without the quotes."""
    return text if text.isprintable() else repr(text)[1:-1]
