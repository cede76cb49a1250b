"""Rewrite the options table in docs/options.md from launcher/settings.py (`make docs`).

tests/test_settings.py fails when the two differ, and names this script."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.views.options_table import options_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "options.md"
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def synced(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{options_table()}{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    new = synced(text)
    if new != text:
        DOC.write_text(new)
        print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
