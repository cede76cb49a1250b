"""launcher/settings.py: every setting declared once, and everything derived from the declarations."""

from __future__ import annotations

import ast
import re

import click
import pytest

from launcher import recipes, settings
from launcher.cli import cli
from launcher.errors import UserInputError
from launcher.views.options_table import options_table
from tests.helpers import REPO

RUN_OPTIONS = {p.name: p for p in cli.commands["run"].params if isinstance(p, click.Option)}


@pytest.mark.parametrize("name", list(settings.DECLARATIONS))
def test_every_setting_is_a_run_option_made_from_its_declaration(name):
    declared, option = settings.declaration(name), RUN_OPTIONS[name]
    assert option.opts == [declared.flag] and option.help == declared.help
    if declared.type is bool:
        assert option.is_flag and bool(option.secondary_opts) == declared.negatable
        assert option.default is declared.default
    elif declared.choices:
        assert tuple(option.type.choices) == declared.choices and option.default == declared.default
    else:
        assert option.default == declared.default


def test_run_has_no_option_outside_the_settings():
    assert set(RUN_OPTIONS) == set(settings.DECLARATIONS)


def test_recipe_keys_come_from_the_settings():
    keys = settings.recipe_keys()
    assert keys["host"].name == "host_spec" and keys["model"].name == "model"
    assert "recipe" not in keys and "ds_config" not in keys and "dry_run" not in keys
    assert all(d.recipe_key == key for key, d in keys.items())


def test_layering_defaults_recipe_mode_pins_typed():
    """defaults < recipe < mode < ds_config pins < typed: each layer wins over the ones before it."""
    layered = settings.layer(
        {"model": "gpt2", "micro_batch": 8, "zero_stage": "auto"},
        recipe={"steps": 40, "micro_batch": 2, "lr": 1e-4, "seq_len": 64},
        mode={"steps": 3},
        pins={"zero_stage": "3", "grad_accum": 4, "seq_len": 128},
    )
    assert layered.micro_batch == 8  # typed over the recipe
    assert layered.steps == 3  # the mode over the recipe
    assert layered.lr == 1e-4  # the recipe over the default
    assert layered.zero_stage == "3"  # a typed 'auto' yields to the pin
    assert (layered.grad_accum, layered.seq_len) == (4, 128)  # pins over recipe and defaults
    assert layered.warmup_steps == settings.declaration("warmup_steps").default
    assert layered.typed == {"model", "micro_batch", "zero_stage"}


def test_a_typed_value_contradicting_the_ds_config_is_refused():
    with pytest.raises(UserInputError, match="--zero-stage 2 contradicts '3' in --ds-config ds.json"):
        settings.layer({"model": "gpt2", "zero_stage": "2", "ds_config": "ds.json"}, pins={"zero_stage": "3"})
    typed = {"model": "gpt2", "nvme_path": "/nvme/", "ds_config": "x"}
    assert settings.layer(typed, pins={"nvme_path": "/nvme"}).nvme_path == "/nvme"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"micro_batch": 0}, "--micro-batch must be at least 1, got 0"),
        ({"warmup_steps": -1}, "--warmup-steps must not be negative, got -1"),
        ({"lr": 0.0}, "--lr must be positive, got 0.0"),
        ({"epochs": -2.0}, "--epochs must be positive, got -2.0"),
        ({"smoke_layers": 0}, "--smoke-layers must be at least 1, got 0"),
        ({"precision": "fp8"}, "--precision must be one of auto, bf16, fp16, got fp8"),
        ({"zero_stage": "2", "offload_param": "cpu"}, "--offload-param cpu needs ZeRO-3"),
        ({"zero_stage": "1", "offload_optimizer": "nvme"}, "with ZeRO-3 only"),
        ({"steps": 0, "seq_len": 0}, "--seq-len must be at least 1, got 0; --steps must be at least 1, got 0"),
        ({"model": None}, "missing --model ID|DIR"),
        ({"junit_xml": "x.xml"}, "--junit-xml only applies to a smoke test: add --smoke"),
        ({"smoke": True}, "--smoke trains a few steps on real data: add --data PATH"),
        ({"smoke": True, "data": "d", "dry_run": True}, "--smoke and --dry-run exclude each other"),
    ],
)
def test_bounds_and_rules_are_checked_with_one_line_naming_the_flag(values, message):
    with pytest.raises(UserInputError, match=re.escape(message)):
        settings.layer({"model": "gpt2"} | values)
    assert "\n" not in "; ".join(settings.problems(values))


def test_a_recipe_value_is_checked_like_a_typed_one(tmp_path):
    file = tmp_path / "r.yaml"
    file.write_text("model: gpt2\nmicro_batch: 0\n")
    recipe = recipes.load(file)
    with pytest.raises(UserInputError, match="--micro-batch must be at least 1, got 0"):
        settings.layer({}, recipe=recipe.options)


def test_docs_options_table_is_generated_from_the_settings():
    text = (REPO / "docs" / "options.md").read_text()
    between = text.split("<!-- options:begin -->\n", 1)[1].split("<!-- options:end -->", 1)[0]
    assert between == options_table(), "docs/options.md is stale: run `make docs`"


CORE_PACKAGES = [p for p in (REPO / "launcher").rglob("*.py") if "cli" not in p.relative_to(REPO / "launcher").parts]


@pytest.mark.parametrize("module", CORE_PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_core_modules_never_import_click_or_print(module):
    """Only launcher/cli parses and prints; the core returns results and raises domain errors. (The rank side
    and the bench tool run in their own processes, where printing progress is their job, as does the ZeRO-cost
    probe, which prints its figures to the probe that started it.)"""
    tree = ast.parse(module.read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "click" not in imported
    own_process = module.parent.name == "rank" or module.name in ("bench.py", "zero_costs.py", "measuring_process.py")
    if not own_process:
        prints = [
            n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
        ]
        assert prints == [], f"print() at lines {prints}"
