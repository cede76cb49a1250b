"""Recipes: a model, a host and a workload in one small YAML file, loaded by name or path.

A recipe's keys are the settings' recipe keys (launcher/settings.py: `model`, `host`, `seq_len`,
`micro_batch` ...); `Recipe.options` maps them to setting names (`model`, `host_spec`, ...), the layer
`settings.layer()` puts under what the user typed. Its leading comment says who it is for, and its `expect:`
block records the strategy the planner picks (tests/test_recipes.py holds every bundled recipe to it).

Paths in a recipe are relative to the recipe file; `package:demo/tiny-llama` points inside the installed
launcher package (so the bundled demo works from any folder and from a wheel); `output_dir` is relative to
the folder the user runs from, like `--output-dir`. `host:` is a described host's name (recipes/hosts), a
file, or `this` for the live machine.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from launcher import settings, textfiles
from launcher.errors import UserInputError, nearest, unknown_key_message
from launcher.resources import PACKAGE_DIR, resource_path
from launcher.settings import Kind

LIVE_HOST = "this"
PACKAGE_PREFIX = "package:"
_HOST_SUFFIXES = (".yaml", ".yml", ".json")

EXPECT_KEYS = {"strategy"}  # the Strategy.label the planner picks, e.g. "ZeRO-2 + opt->cpu"


@dataclass(frozen=True)
class Recipe:
    name: str  # the file name without .yaml
    path: Path
    description: str  # the leading comment, one paragraph
    options: dict  # setting name -> value, only for the keys the recipe sets
    expect: dict  # what the planner picks for it: {"strategy": label}

    @property
    def summary(self) -> str:
        """The description's first sentence: who the recipe is for (for listings)."""
        return self.description.split(". ", 1)[0].rstrip(".")


def recipe_dir() -> Path:
    """The bundled recipes: repo `recipes/` in a checkout, `launcher/recipes/` in an installed wheel."""
    return resource_path("recipes")


def hosts_dir() -> Path:
    return recipe_dir() / "hosts"


def host_names() -> list[str]:
    return sorted(p.stem for p in hosts_dir().iterdir() if p.suffix in _HOST_SUFFIXES)


def available() -> list[Recipe]:
    """Every bundled recipe, by name (the hosts/ folder holds described hosts, not recipes)."""
    return [load(path) for path in sorted(recipe_dir().glob("*.yaml"), key=lambda path: path.stem)]  # as names()


def names() -> list[str]:
    return sorted(path.stem for path in recipe_dir().glob("*.yaml"))


def find(name_or_path: str) -> Recipe:
    """A recipe by bundled name (`llama2-7b-1x24g`, with or without .yaml) or by file path."""
    file = Path(name_or_path).expanduser()
    if file.is_file():
        return load(file)
    bundled = recipe_dir() / f"{file.stem if file.suffix in ('.yaml', '.yml') else name_or_path}.yaml"
    if bundled.is_file() and file.parent == Path("."):
        return load(bundled)
    choices = names()
    hint = nearest(file.stem, choices)
    tail = f"did you mean '{hint}'? " if hint else ""
    what = (
        f"recipe file {name_or_path} does not exist"
        if _looks_like_path(name_or_path)
        else f"unknown recipe '{name_or_path}'"
    )
    raise UserInputError(f"{what}; {tail}bundled recipes: {', '.join(choices)} (or pass a recipe file)")


def host_spec_path(name_or_path: str, relative_to: Path | None = None, flag: str = "--host-spec") -> str | None:
    """A described host by name (`1x-a100-80g`, from recipes/hosts), by file path (relative paths are taken
    from `relative_to` when given, else the current folder), or `this` for the live host (None). `flag`
    starts the error message: the option or recipe key the value came from."""
    if name_or_path == LIVE_HOST:
        return None
    file = _resolve_path(name_or_path, relative_to)
    if file.is_file():
        return str(file)
    if Path(name_or_path).parent == Path("."):
        for suffix in ("", *_HOST_SUFFIXES):
            candidate = hosts_dir() / f"{name_or_path}{suffix}"
            if candidate.is_file():
                return str(candidate)
    choices = host_names()
    if _looks_like_path(name_or_path):
        where = f" ({file})" if str(file) != name_or_path else ""
        raise UserInputError(
            f"{flag} {name_or_path} does not exist{where}; pass a YAML or JSON host description, a described "
            f"host's name ({', '.join(choices)}), or '{LIVE_HOST}' for this machine"
        )
    hint = nearest(name_or_path, choices)
    tail = f"did you mean '{hint}'? " if hint else ""
    raise UserInputError(
        f"{flag} {name_or_path}: no described host of that name; {tail}described hosts: {', '.join(choices)} "
        f"(or a YAML/JSON file, or '{LIVE_HOST}' for this machine)"
    )


def load(path: str | Path) -> Recipe:
    """Read and check one recipe file. Every problem in it is reported at once, each with its line."""

    file = Path(path)
    try:
        text = textfiles.read_text(file)
    except OSError as exc:
        raise UserInputError(f"recipe {path}: {exc.strerror}; pass a recipe name or a YAML file") from None
    data = textfiles.parse(text, path)
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: a recipe is a mapping of keys (model: ..., host: ...), got {data!r}")
    lines = textfiles.key_lines(text)
    problems: list[str] = []

    def at(key: str) -> str:
        line = lines.get(key)
        return f"{path}:{line}" if line else str(path)

    keys = settings.recipe_keys()
    options: dict = {}
    for key, value in data.items():
        if key == "expect":
            continue
        if key not in keys:
            problems.append(unknown_key_message(str(key), [*keys, "expect"], f"recipe ({at(str(key))})"))
            continue
        declared = keys[key]
        try:
            options[declared.name] = _convert(value, declared, file.parent)
        except UserInputError as err:  # host_spec_path's message already starts with "host:"
            problems.append(f"{at(key)}: {err}" if declared.kind is Kind.HOST else f"{at(key)}: {key}: {err}")

    expect = data.get("expect") or {}
    if not isinstance(expect, dict):
        problems.append(f"{at('expect')}: expect: expected a mapping (strategy: ...), got {expect!r}")
        expect = {}
    for key, value in expect.items():
        if key not in EXPECT_KEYS:
            problems.append(unknown_key_message(str(key), EXPECT_KEYS, f"recipe expect ({at(f'expect.{key}')})"))
        elif not isinstance(value, str):
            problems.append(f"{at(f'expect.{key}')}: expect.{key}: expected a string, got {value!r}")
    if problems:
        raise UserInputError("\n".join(problems))
    return Recipe(name=file.stem, path=file, description=_leading_comment(text), options=options, expect=expect)


def _convert(value: object, declared: settings.Declaration, base: Path) -> object:
    """One recipe value into what the same option typed on the command line would give."""
    if declared.choices:
        text = str(value)
        if isinstance(value, bool) or text not in declared.choices:
            raise UserInputError(f"expected one of {', '.join(declared.choices)}, got {value!r}")
        return text
    if declared.type is bool:
        if not isinstance(value, bool):
            raise UserInputError(f"expected true or false, got {value!r}")
        return value
    if declared.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(f"expected an integer, got {value!r}")
        return value
    if declared.type is float:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # YAML 1.1 reads 2e-5 (no dot) as a string
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"expected a number, got {value!r}")
        return float(value)
    if not isinstance(value, str) or not value:
        raise UserInputError(f"expected a string, got {value!r}")
    if declared.kind is Kind.HOST:
        return host_spec_path(value, relative_to=base, flag="host:")
    if declared.kind is Kind.PATH:
        return str(_resolve_path(value, base))
    if declared.kind is Kind.MODEL:
        return _model_spec(value, base)
    return value


def _resolve_path(value: str, base: Path | None) -> Path:
    """`package:REST` inside the launcher package; ~ expanded; relative paths taken from `base`."""
    if value.startswith(PACKAGE_PREFIX):
        return PACKAGE_DIR / value[len(PACKAGE_PREFIX) :]
    path = Path(value).expanduser()
    return path if path.is_absolute() or base is None else Path(os.path.normpath(base / path))


def _model_spec(value: str, base: Path) -> str:
    """A folder when the recipe points at one (package:, ./, ../, /, ~, or one that exists beside the
    recipe); otherwise a hub id, passed on unchanged."""
    path = _resolve_path(value, base)
    explicit = value.startswith((PACKAGE_PREFIX, "./", "../", "/", "~"))
    return str(path) if explicit or path.exists() else value


def _looks_like_path(value: str) -> bool:
    return "/" in value or Path(value).suffix in (*_HOST_SUFFIXES, ".yml")


def _leading_comment(text: str) -> str:
    """The comment lines at the top of the file, as one paragraph."""
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if stripped or lines:
                break
            continue
        lines.append(stripped.lstrip("#").strip())
    return " ".join(line for line in lines if line)
