"""The README and docs/ stay true: every offload-launch command they show parses with the real CLI; their lists
of recipes, described hosts, recipe keys, `run` options and smoke exit codes are the ones the code has; each
of those lists is in exactly one file; and every relative link points to a file (and heading) that exists."""

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

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS = {path.relative_to(REPO).as_posix(): path.read_text() for path in DOC_FILES}
README = DOCS["README.md"]
ALL_TEXT = "\n\n".join(DOCS.values())
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", flags=re.MULTILINE | re.DOTALL)
BLOCKS = {name: [(lang, body) for _indent, lang, body in FENCE.findall(text)] for name, text in DOCS.items()}
ALL_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks]
PLACEHOLDER = re.compile(r"\[|\||\.\.\.|^(ID|DIR|FILE|NAME|PATH|RUN|PNG|N|E|K|LR|RATIO|MINUTES)$")
OPTIONS_BEGIN, OPTIONS_END = "<!-- options:begin -->", "<!-- options:end -->"


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


def doc_commands(blocks) -> list[str]:
    """Every offload-launch invocation in a file's fenced blocks: shell lines (a leading `$ `, environment
    assignments and `.venv/bin/` dropped, trailing comments kept out by shlex) and the `run:` steps of YAML
    blocks."""
    commands = []
    for lang, body in blocks:
        lines = list(_yaml_run_steps(yaml.safe_load(body))) if lang == "yaml" else body.splitlines()
        for line in lines:
            text = " ".join(line.split()).removeprefix("$ ")
            text = re.sub(r"^(\w+=\S+\s+)+", "", text).replace(".venv/bin/offload-launch", "offload-launch")
            text = re.split(r" [>|] ", text)[0]  # a redirection or pipe ends the command
            if text.startswith("offload-launch ") or text == "offload-launch":
                commands.append(text)
    return commands


COMMANDS = {name: doc_commands(blocks) for name, blocks in BLOCKS.items()}
ALL_COMMANDS = [command for commands in COMMANDS.values() for command in commands]


def the_file_holding(anchor: str) -> str:
    """The text of the one file that holds `anchor`: each list the code owns is written down exactly once."""
    holders = [name for name, text in DOCS.items() if anchor in text]
    assert len(holders) == 1, f"{anchor!r} should be in exactly one of README.md, docs/*.md; found in {holders}"
    return DOCS[holders[0]]


def test_the_docs_are_there():
    assert len(DOCS) >= 10  # README.md and the docs/ pages it links to
    assert len(README.splitlines()) <= 300, "README.md is the newcomer's page: move reference text into docs/"


def test_the_docs_show_commands():
    assert len(ALL_COMMANDS) > 20  # the extraction itself works: docs without commands would pass vacuously
    assert any(c.startswith("offload-launch check ") for c in ALL_COMMANDS)
    assert any("--smoke-layers" in c for c in ALL_COMMANDS)
    assert len(COMMANDS["README.md"]) >= 5  # the five everyday commands


@pytest.mark.parametrize(
    "command",
    [pytest.param(command, id=f"{name}: {command}") for name, commands in COMMANDS.items() for command in commands],
)
def test_every_documented_command_parses(command):
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
    listings = [body for _lang, body in ALL_BLOCKS if body.startswith("$ offload-launch recipes\n")]
    assert len(listings) == 1, f"the `offload-launch recipes` listing should be shown once, not {len(listings)} times"
    rows = [line.split(None, 1) for line in listings[0].splitlines()[1:]]
    assert [name for name, _rest in rows] == recipes.names()
    for name, rest in rows:
        recipe = recipes.find(name)
        assert rest.startswith(recipe.expect["strategy"] + " "), name
        assert rest.endswith(recipe.summary), name


def test_described_hosts_listed_are_the_shipped_ones():
    anchor = "Ready-made descriptions live in `recipes/hosts/`"
    paragraph = the_file_holding(anchor).split(anchor, 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"`([0-9a-z-]+)`", paragraph.split(":", 1)[1])
    assert sorted(listed) == recipes.host_names()


def _recipe_keys_in_code() -> set[str]:
    """The keys a recipe may set: the settings' recipe keys (launcher/settings.py)."""
    from launcher import settings

    return set(settings.recipe_keys())


def test_every_recipe_key_is_in_the_options_table():
    """docs/options.md's table (generated from launcher/settings.py) names each option's recipe key."""
    table = DOCS["docs/options.md"].split(OPTIONS_BEGIN, 1)[1].split(OPTIONS_END, 1)[0]
    named = set(re.findall(r"(?<=\| )`([a-z_]+)`(?= \|)", table))
    assert _recipe_keys_in_code() <= named


def test_smoke_checks_and_exit_codes_are_the_code_s():
    anchor = "| check | passes when | exit | when it fails |"
    table = the_file_holding(anchor).split(anchor, 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in row.split("|")[1:-1]] for row in table.splitlines()[2:]]
    assert {row[0].strip("`"): int(row[2]) for row in rows} == smoke.EXIT_CODES
    exit_rows = [line for line in ALL_TEXT.splitlines() if line.startswith("| 10–18 |")]
    assert len(exit_rows) == 1, exit_rows
    assert dict(re.findall(r"(\d+) `(\w+)`", exit_rows[0])) == {str(v): k for k, v in smoke.EXIT_CODES.items()}
    assert f"--smoke-timeout MINUTES` (default {smoke.DEFAULT_TIMEOUT_MINUTES:g})" in ALL_TEXT
    assert f"--smoke-memory-tolerance RATIO` (default {smoke.DEFAULT_MEMORY_TOLERANCE:g})" in ALL_TEXT
    assert f"`--steps` defaults to {smoke.DEFAULT_STEPS}" in ALL_TEXT
    lr = re.search(r"the learning rate is a constant (\S+) × min\(1, (\d+) / hidden size\)", ALL_TEXT)
    assert (
        lr
        and float(lr.group(1)) == smoke.default_lr(1)
        and smoke.default_lr(4096) == float(lr.group(1)) * int(lr.group(2)) / 4096
    )


def test_the_options_table_is_run_s_options():
    """docs/options.md holds the `run` options reference between two marker lines (generated from the code
    later, so the table stays contiguous there): every option it names is one of `run`'s, and every one of
    `run`'s options is named."""
    lines = DOCS["docs/options.md"].splitlines()
    assert lines.count(OPTIONS_BEGIN) == 1 and lines.count(OPTIONS_END) == 1
    between = lines[lines.index(OPTIONS_BEGIN) + 1 : lines.index(OPTIONS_END)]
    assert between and all(line.startswith("|") for line in between), "only table rows between the markers"
    run = cli.commands["run"]
    options = [param for param in run.params if isinstance(param, click.Option)]
    known = {opt for param in options for opt in (*param.opts, *param.secondary_opts)} - {"--help", "-h"}
    first_column = " ".join(row.split("|")[1] for row in between[2:] if "|" in row)
    named = set(re.findall(r"--[a-z][a-z0-9-]*", first_column))
    assert named <= known, f"not options of `offload-launch run`: {sorted(named - known)}"
    mentioned = set(re.findall(r"--[a-z][a-z0-9-]*(?![\w-])", "\n".join(between)))
    assert known <= mentioned, f"`run` options missing from docs/options.md: {sorted(known - mentioned)}"


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links and headings live."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered."""
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _relative_links(text: str) -> list[str]:
    prose = _prose(text)
    inline = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose)
    reference = re.findall(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", prose, flags=re.MULTILINE)
    return [link for link in inline + reference if not re.match(r"^[a-z][a-z0-9+.-]*:", link, re.IGNORECASE)]


def test_readme_links_every_doc():
    linked = {(REPO / link.split("#", 1)[0]).resolve() for link in _relative_links(README) if not link.startswith("#")}
    missing = [path.name for path in DOC_FILES[1:] if path.resolve() not in linked]
    assert not missing, f"README.md does not link to {missing}"


@pytest.mark.parametrize("name", list(DOCS))
def test_every_relative_link_resolves(name):
    source = REPO / name
    links = _relative_links(DOCS[name])
    if name == "README.md":
        assert links  # the extraction itself works
    for link in links:
        target, _, fragment = link.partition("#")
        path = (source.parent / target).resolve() if target else source.resolve()
        assert path.exists(), f"{name}: link to {link}: {path} does not exist"
        if fragment and path.suffix == ".md":
            assert fragment in _heading_anchors(path.read_text()), f"{name}: link to {link}: no such heading"
