"""The one way to find a file shipped with offload-launch, from a checkout and from a wheel alike.

Bundled files live in two kinds of place, and callers need not know which:
- inside the package: `demo/` (the tiny Llama and its corpus), `models/` (hub configs for offline planning),
  `schemas/` (the ds_config JSON Schema);
- at the top of the repository, where the product's owner fixed them: `templates/` (ds_config fragments)
  and `recipes/` (recipes and described hosts). A wheel carries these inside the package
  (`launcher/templates`, `launcher/recipes`, via hatch's force-include in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def resource_path(relative: str) -> Path:
    """The bundled file or folder `relative` (e.g. "templates", "models/aliases.json", "recipes/hosts")."""
    for root in (PACKAGE_DIR, PACKAGE_DIR.parent):
        candidate = root / relative
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"offload-launch is missing its bundled '{relative}'; reinstall the package")
