"""Find the data files shipped with the project: in a wheel they live inside the package
(`launcher/templates`, `launcher/recipes`, via hatch's force-include); in a checkout or an editable
install they are the top-level `templates/` and `recipes/` folders."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"offload-launch is missing its '{name}' folder; reinstall the package")
