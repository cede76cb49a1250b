"""The settings as the Markdown table in docs/options.md (`make docs` writes it between its markers)."""

from __future__ import annotations

from launcher.settings import DECLARATIONS


def options_table() -> str:
    """docs/options.md's table of `run` options (Markdown), one row per setting in declaration order."""
    lines = ["| Option | Group | Default | Recipe key | What it does |", "|---|---|---|---|---|"]
    for d in DECLARATIONS.values():
        option = d.flags + (f" {d.metavar}" if d.metavar else "")
        if d.choices:
            option += " " + "|".join(d.choices)
        elif not d.metavar and d.type in (int, float):
            option += " INTEGER" if d.type is int else " FLOAT"
        default = "" if d.default is None or (d.type is bool and not d.negatable) else f"`{d.default}`"
        key = f"`{d.recipe_key}`" if d.recipe_key else ""
        cells = (f"`{option}`", d.group.value, default, key, d.help)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
