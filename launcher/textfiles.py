"""Reading the YAML/JSON files people write (host descriptions, recipes): every way such a file can be
broken is one line that names the file and, where there is one, the line."""

from __future__ import annotations

import contextlib
import json
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
