"""The README stays true: every offload-launch command it shows parses with the real CLI, and its lists of
recipes, described hosts, recipe keys and smoke exit codes are the ones the code has."""

from __future__ import annotations

import re
import shlex

import click
import pytest
import yaml

from launcher import recipes
from launcher.cli import cli
from launcher.job import smoke
from tests.helpers import REPO

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)
PLACEHOLDER = re.compile(r"\[|\||\.\.\.|^(ID|DIR|FILE|NAME|PATH|RUN|PNG|N|E|K|LR|RATIO|MINUTES)$")


def _yaml_run_steps(node):
    """The `run:` strings of a GitHub Actions workflow, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "run" and isinstance(value, str):
                yield value
            else:
                yield from _yaml_run_steps(value)
    elif isinstance(node, list):
        for value in node:
            yield from _yaml_run_steps(value)


def readme_commands() -> list[str]:
    """Every offload-launch invocation in a fenced block: shell lines (a leading `$ `, environment
    assignments and `.venv/bin/` dropped, trailing comments kept out by shlex) and the `run:` steps of YAML
    blocks."""
    commands = []
    for lang, body in BLOCKS:
        lines = list(_yaml_run_steps(yaml.safe_load(body))) if lang == "yaml" else body.splitlines()
        for line in lines:
            text = " ".join(line.split()).removeprefix("$ ")
            text = re.sub(r"^(\w+=\S+\s+)+", "", text).replace(".venv/bin/offload-launch", "offload-launch")
            text = re.split(r" [>|] ", text)[0]  # a redirection or pipe ends the command
            if text.startswith("offload-launch ") or text == "offload-launch":
                commands.append(text)
    return commands


COMMANDS = readme_commands()


def test_the_readme_shows_commands():
    assert len(COMMANDS) > 20  # the extraction itself works: a README without commands would pass vacuously
    assert any(c.startswith("offload-launch check ") for c in COMMANDS)
    assert any("--smoke-layers" in c for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses(command):
    """Options, choices and types as Click parses them (placeholders such as ID|DIR or [options] are left
    to the usage lines they appear in: only their option names are checked)."""
    args = shlex.split(command, comments=True)[1:]
    if args and args[0] in cli.commands:
        name, args = args[0], args[1:]
    else:
        name = "run"
    command_obj = cli.commands[name]
    args = args[: args.index("--")] if "--" in args else args  # the rest goes to DeepSpeed's launcher
    known = {opt for param in command_obj.params for opt in (*param.opts, *param.secondary_opts)}
    known |= {"--help", "-h", "--version"}
    for arg in args:
        if arg.startswith("--"):
            assert arg.split("=")[0] in known, f"{arg} is not an option of `offload-launch {name}`: {command}"
    if any(PLACEHOLDER.search(arg) for arg in args) or "--version" in args:
        return
    with click.Context(cli) as parent:
        command_obj.make_context(name, list(args), parent=parent)  # raises on a bad choice, type or arity


def test_recipes_listing_matches_the_bundled_recipes():
    block = next(body for _lang, body in BLOCKS if body.startswith("$ offload-launch recipes\n"))
    rows = [line.split(None, 1) for line in block.splitlines()[1:]]
    assert [name for name, _rest in rows] == recipes.names()
    for name, rest in rows:
        recipe = recipes.find(name)
        assert rest.startswith(recipe.expect["strategy"] + " "), name
        assert rest.endswith(recipe.summary), name


def test_described_hosts_listed_are_the_shipped_ones():
    paragraph = README.split("Ready-made descriptions live in `recipes/hosts/`", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"`([0-9a-z-]+)`", paragraph.split(":", 1)[1])
    assert sorted(listed) == recipes.host_names()


def test_recipe_key_table_covers_every_key():
    table = README.split("| key | values |", 1)[1].split("\n\n", 1)[0]
    first_column = [row.split("|")[1] for row in table.splitlines()[2:]]
    keys = set(re.findall(r"`([a-z_]+)", " ".join(first_column)))
    assert keys == set(recipes.KEYS) | {"expect"}


def test_smoke_checks_and_exit_codes_are_the_code_s():
    table = README.split("| check | passes when | exit | when it fails |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in row.split("|")[1:-1]] for row in table.splitlines()[2:]]
    assert {row[0].strip("`"): int(row[2]) for row in rows} == smoke.EXIT_CODES
    exit_row = next(line for line in README.splitlines() if line.startswith("| 10–18 |"))
    assert dict(re.findall(r"(\d+) `(\w+)`", exit_row)) == {str(v): k for k, v in smoke.EXIT_CODES.items()}
    assert f"--smoke-timeout MINUTES` (default {smoke.DEFAULT_TIMEOUT_MINUTES:g})" in README
    assert f"--smoke-memory-tolerance RATIO` (default {smoke.DEFAULT_MEMORY_TOLERANCE:g})" in README
    assert f"`--steps` defaults to {smoke.DEFAULT_STEPS}" in README
    lr = re.search(r"the learning rate is a constant (\S+) × min\(1, (\d+) / hidden size\)", README)
    assert (
        lr
        and float(lr.group(1)) == smoke.default_lr(1)
        and smoke.default_lr(4096) == float(lr.group(1)) * int(lr.group(2)) / 4096
    )
