"""Recipes and described hosts: every bundled one loads and plans the strategy its `expect:` block records,
the command line overrides a recipe, and a wrong name, key or value gets one line naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import recipes
from launcher.cli import cli
from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from tests.helpers import HOSTS, REPO, save_config, tiny_llama_config

RECIPE_NAMES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
HOST_NAMES = sorted(p.stem for p in HOSTS.glob("*.yaml"))
RUN_PARAMS = {param.name: param for param in cli.commands["run"].params}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def plan_json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def recipe_argv(recipe: recipes.Recipe) -> list[str]:
    """The recipe's options spelled as the flags a user would type (what `--recipe NAME` stands for)."""
    argv: list[str] = []
    for name, value in recipe.options.items():
        param = RUN_PARAMS[name]
        if value is None:  # host: this -> no --host-spec, probe the live host
            continue
        if getattr(param, "is_flag", False):
            if value or param.secondary_opts:
                argv.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            argv += [param.opts[0], str(value)]
    return argv


@pytest.fixture(autouse=True)
def tested_torch(monkeypatch):
    """The ranks' torch as pyproject.toml names it tested (2.13.0), whatever this venv holds: a CUDA plan then
    sets host_buffers.PINNED_ALLOC_CONF and counts the pinned buffers unrounded. The recipes' `expect` is that plan;
    with an older torch (power-of-two rounding) llama2-70b-1x80g-nvme's params would go to NVMe too."""
    from launcher.job import planning

    monkeypatch.setattr(planning, "installed_torch_version", lambda: "2.13.0")


@pytest.fixture
def write_recipe(tmp_path: Path):
    def write(text: str, name: str = "mine.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return write


# ---------------------------------------------------------------------------------------------- bundled


def test_the_bundled_recipes_are_the_ones_this_test_knows():
    assert recipes.recipe_dir().resolve() == (REPO / "recipes").resolve()
    assert [r.name for r in recipes.available()] == RECIPE_NAMES == recipes.names()
    assert "hosts" not in RECIPE_NAMES and not set(HOST_NAMES) & set(RECIPE_NAMES)
    for required in (
        "llama2-7b-1x24g",
        "llama2-7b-1x80g",
        "llama2-7b-8x80g",
        "llama2-70b-1x80g-nvme",
        "mistral-7b-2x24g",
        "mixtral-8x7b-1x80g-nvme",
        "tiny-demo",
    ):
        assert required in RECIPE_NAMES


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_loads(name: str):
    recipe = recipes.find(name)
    assert recipe.name == name and recipe.path.is_file()
    assert len(recipe.description) > 40 and recipe.summary and "#" not in recipe.description
    assert recipe.expect["strategy"].startswith("ZeRO-")
    assert set(recipe.options) <= set(RUN_PARAMS)
    assert recipe.options["model"]
    host = recipe.options.get("host_spec")
    assert host is None or Path(host).is_file()
    for key in ("data", "hostfile"):
        assert key not in recipe.options or Path(recipe.options[key]).exists()
    assert recipes.find(f"{name}.yaml") == recipe == recipes.load(recipe.path) == recipes.find(str(recipe.path))


@pytest.mark.parametrize("name", HOST_NAMES)
def test_described_host_loads_by_name_and_path(name: str):
    path = recipes.host_spec_path(name)
    assert Path(path) == recipes.hosts_dir() / f"{name}.yaml"
    assert recipes.host_spec_path(f"{name}.yaml") == path
    assert recipes.host_spec_path(str(HOSTS / f"{name}.yaml")) == str(HOSTS / f"{name}.yaml")
    host = load_host_spec(path)
    assert host.cpu_memory_bytes > 0 and host.world_size >= 1
    assert host.notes and host.notes[0].startswith("described host ")  # every bundled host has a name


def test_llama2_7b_1x24g_is_the_workstation_of_the_readme():
    recipe = recipes.find("llama2-7b-1x24g")
    host = load_host_spec(recipe.options["host_spec"])
    assert host.gpus.count == 1 and host.gpus.memory_bytes == 24 * 2**30
    # 192 GB: the optimizer in CPU RAM needs more than a 128 GB machine's 108.8 GiB usable (fp32 states and
    # gradients plus DeepSpeed's pinned 16-bit staging and accumulation buffers)
    assert host.cpu_memory_bytes == 192 * 2**30


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_plans_its_expected_strategy(name: str, tmp_path: Path, monkeypatch):
    """The recipe's values typed as flags (works without --recipe): the plan picks what `expect` says."""
    monkeypatch.chdir(tmp_path)  # bundled recipes work from any folder
    recipe = recipes.find(name)
    data = plan_json(invoke(*recipe_argv(recipe), "--dry-run", "--json"))
    assert data["strategy"]["label"] == recipe.expect["strategy"]
    assert data["workload"]["seq_len"] == recipe.options["seq_len"]


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipe_option_plans_its_expected_strategy(name: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = recipes.find(name)
    data = plan_json(invoke("--recipe", name, "--dry-run", "--json"))
    assert data["strategy"]["label"] == recipe.expect["strategy"]
    workload = data["workload"]
    assert (workload["seq_len"], workload["micro_batch"]) == (recipe.options["seq_len"], recipe.options["micro_batch"])
    assert workload["grad_accum"] == recipe.options["grad_accum"]


def test_the_offload_mode_recipes_plan_their_mode(tmp_path: Path, monkeypatch):
    """The recipes for DeepSpeed's newer offload modes (docs/planning.md): each plan writes its mode into the
    ds_config, and without the mode the same workload falls back to the optimizer on NVMe."""
    monkeypatch.chdir(tmp_path)
    partial = plan_json(invoke("--recipe", "llama2-7b-2x24g-partial", "--dry-run", "--json"))
    ratio = partial["strategy"]["offload_ratio"]
    assert partial["strategy"]["zero_stage"] == 3 and 0 < ratio < 1
    assert partial["ds_config"]["zero_optimization"]["offload_optimizer"]["ratio"] == ratio
    whole = plan_json(invoke("--recipe", "llama2-7b-2x24g-partial", "--offload-ratio", "1", "--dry-run", "--json"))
    assert whole["strategy"]["offload_optimizer"] == "nvme"

    states = plan_json(invoke("--recipe", "llama2-7b-bf16-1x24g", "--dry-run", "--json"))
    assert states["strategy"]["optimizer_states"] == "bf16"
    assert states["ds_config"]["bf16"] == {
        "enabled": True,
        "bf16_master_weights_and_grads": True,
        "bf16_optimizer_states": True,
    }
    fp32 = plan_json(invoke("--recipe", "llama2-7b-bf16-1x24g", "--optimizer-states", "fp32", "--dry-run", "--json"))
    # fp32 states fit only with ZeRO-3 (ZeRO-2 peaks at its checkpoint save), slower than bf16 states with ZeRO-2
    assert (fp32["strategy"]["zero_stage"], fp32["strategy"]["offload_optimizer"]) == (3, "cpu")
    assert fp32["estimates"]["step_seconds"] > states["estimates"]["step_seconds"]

    zenflow = plan_json(invoke("--recipe", "llama2-7b-zenflow-1x80g", "--dry-run", "--json"))
    assert zenflow["strategy"]["zenflow_interval"] == 4 and zenflow["workload"]["grad_accum"] == 1
    assert zenflow["ds_config"]["zero_optimization"]["zenflow"]["update_interval"] == 4


def test_command_line_overrides_the_recipe():
    base = plan_json(invoke("--recipe", "llama2-7b-1x24g", "--dry-run", "--json"))
    assert base["strategy"]["zero_stage"] == 2
    data = plan_json(
        invoke("--recipe", "llama2-7b-1x24g", "--zero-stage", "3", "--seq-len", "1024", "--dry-run", "--json")
    )
    assert data["strategy"]["zero_stage"] == 3 and data["strategy"]["label"] != base["strategy"]["label"]
    assert data["workload"]["seq_len"] == 1024  # typed
    assert data["workload"]["grad_accum"] == 32  # from the recipe
    assert data["host"]["source"].endswith("1x-rtx4090-24g-192g.yaml")
    # the host too, by name
    moved = plan_json(invoke("--recipe", "llama2-7b-1x24g", "--host-spec", "8x-a100-80g", "--dry-run", "--json"))
    assert moved["workload"]["world_size"] == 8 and moved["host"]["source"].endswith("8x-a100-80g.yaml")


def test_a_recipe_file_outside_the_bundle(write_recipe, tmp_path: Path, monkeypatch):
    save_config(tiny_llama_config(), tmp_path / "work" / "tiny")
    file = write_recipe(
        "# My tiny model on a described 24 GB card.\nmodel: ./tiny\nhost: 1x-rtx4090-24g\nseq_len: 128\n"
        'expect: {strategy: "ZeRO-1"}\n',
        "work/mine.yaml",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    data = plan_json(invoke("--recipe", str(file), "--dry-run", "--json"))
    assert data["model"]["params"] < 10**6 and data["workload"]["seq_len"] == 128


def test_host_spec_by_name_on_the_command_line():
    data = plan_json(invoke("--model", "meta-llama/Llama-2-7b", "--host-spec", "1x-a100-80g", "--dry-run", "--json"))
    assert data["host"]["source"].endswith("1x-a100-80g.yaml")


def test_recipes_command_lists_every_recipe_with_its_strategy():
    result = invoke("recipes")
    assert result.exit_code == 0, result.output
    for recipe in recipes.available():
        assert recipe.name in result.output
        assert recipe.expect["strategy"] in result.output


# ---------------------------------------------------------------------------------------------- resolving


def test_paths_resolve_relative_to_the_recipe_and_the_package(write_recipe, tmp_path: Path):
    (tmp_path / "sub" / "model").mkdir(parents=True)
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "h.yaml").write_text("gpus: {count: 0}\ncpu_memory: 8GiB\n")
    recipe = recipes.load(
        write_recipe(
            "model: model\ndata: ../data/train.jsonl\ntokenizer: gpt2\nhost: ../hosts/h.yaml\noutput_dir: runs/x\n"
            "lr: 2e-5\nzero_stage: 2\nactivation_checkpointing: false\n",
            "sub/r.yaml",
        )
    )
    assert recipe.options["model"] == str(tmp_path / "sub" / "model")  # a folder beside the recipe
    assert recipe.options["data"] == str(tmp_path / "data" / "train.jsonl")
    assert recipe.options["host_spec"] == str(tmp_path / "hosts" / "h.yaml")
    assert recipe.options["tokenizer"] == "gpt2"  # no such folder: a hub id, unchanged
    assert recipe.options["output_dir"] == "runs/x"  # relative to where the user runs, like --output-dir
    assert recipe.options["lr"] == 2e-5  # YAML 1.1 reads 2e-5 as a string
    assert recipe.options["zero_stage"] == "2" and recipe.options["activation_checkpointing"] is False
    assert recipe.description == "" and recipe.expect == {}

    with pytest.raises(
        UserInputError,
        match=r"other\.yaml:1: host: \.\./hosts/g\.yaml does not exist \(.*/hosts/g\.yaml\); pass a YAML",
    ):
        recipes.load(write_recipe("host: ../hosts/g.yaml\n", "sub/other.yaml"))


def test_package_paths_point_into_the_installed_package():
    demo = recipes.find("tiny-demo")
    package = Path(recipes.__file__).resolve().parent
    assert Path(demo.options["model"]) == package / "demo" / "tiny-llama"
    assert (Path(demo.options["model"]) / "config.json").is_file()
    assert Path(demo.options["data"]) == package / "demo" / "data" / "train.jsonl"
    assert demo.options["host_spec"] is None  # host: this = the live machine


def test_host_spec_path_this_and_files(tmp_path: Path, monkeypatch):
    assert recipes.host_spec_path("this") is None
    (tmp_path / "h.yaml").write_text("gpus: {count: 0}\ncpu_memory: 8GiB\n")
    monkeypatch.chdir(tmp_path)
    assert recipes.host_spec_path("h.yaml") == "h.yaml"  # a file in the current folder wins
    assert recipes.host_spec_path("h.yaml", relative_to=tmp_path) == str(tmp_path / "h.yaml")


# ---------------------------------------------------------------------------------------------- errors


def test_unknown_recipe_name_suggests_the_nearest():
    with pytest.raises(UserInputError) as err:
        recipes.find("llama2-7b-1x2g")
    message = str(err.value)
    assert "unknown recipe 'llama2-7b-1x2g'; did you mean 'llama2-7b-1x24g'?" in message
    assert all(name in message for name in RECIPE_NAMES)
    with pytest.raises(UserInputError, match=r"recipe file nowhere/r\.yaml does not exist"):
        recipes.find("nowhere/r.yaml")


def test_unknown_recipe_on_the_command_line_is_one_line_exit_2():
    result = invoke("--recipe", "tiny-dmeo", "--dry-run")
    assert result.exit_code == 2
    assert "did you mean 'tiny-demo'?" in result.output and "Traceback" not in result.output


def test_unknown_host_name_suggests_the_nearest(write_recipe):
    with pytest.raises(UserInputError) as err:
        recipes.host_spec_path("1x-a100-8g")
    message = str(err.value)
    assert message.startswith("--host-spec 1x-a100-8g: no described host of that name; did you mean '1x-a100-80g'?")
    assert all(name in message for name in HOST_NAMES)
    with pytest.raises(UserInputError, match=r"^--host-spec nope\.yaml does not exist; pass a YAML or JSON host"):
        recipes.host_spec_path("nope.yaml")
    file = write_recipe("model: gpt2\n\nhost: 1x-h100-8g\n")
    with pytest.raises(
        UserInputError,
        match=rf"^{file}:3: host: 1x-h100-8g: no described host of that name; did you mean '1x-h100-80g'\?",
    ):
        recipes.load(file)


def test_unknown_key_names_its_line_and_the_nearest_key(write_recipe):
    file = write_recipe("# who\nmodel: gpt2\nhost: cpu-only\nseq_length: 128\nexpect:\n  strategie: ZeRO-1\n")
    with pytest.raises(UserInputError) as err:
        recipes.load(file)
    lines = str(err.value).splitlines()
    assert lines == [
        f"unknown key 'seq_length' in recipe ({file}:4); did you mean 'seq_len'?",
        f"unknown key 'strategie' in recipe expect ({file}:6); did you mean 'strategy'?",
    ]


def test_bad_values_are_reported_together_with_their_lines(write_recipe):
    file = write_recipe("model: gpt2\nzero_stage: 4\nmicro_batch: two\nresume: maybe\nlr: fast\nmodel_spec: x\n")
    with pytest.raises(UserInputError) as err:
        recipes.load(file)
    message = str(err.value)
    assert f"{file}:2: zero_stage: expected one of auto, 1, 2, 3, got 4" in message
    assert f"{file}:3: micro_batch: expected an integer, got 'two'" in message
    assert f"{file}:4: resume: expected true or false, got 'maybe'" in message
    assert f"{file}:5: lr: expected a number, got 'fast'" in message
    assert f"unknown key 'model_spec' in recipe ({file}:6); did you mean 'model'?" in message


def test_malformed_recipes(write_recipe):
    with pytest.raises(UserInputError, match=r"mine\.yaml:2: invalid YAML"):
        recipes.load(write_recipe("model: gpt2\n  seq_len: 128\n"))
    with pytest.raises(UserInputError, match="a recipe is a mapping of keys"):
        recipes.load(write_recipe("- model\n"))
    with pytest.raises(UserInputError, match=r"expect: expected a mapping"):
        recipes.load(write_recipe("model: gpt2\nexpect: ZeRO-1\n"))
