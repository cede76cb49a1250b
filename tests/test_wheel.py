"""The wheel: it carries every data file the tool reads (templates, recipes, described hosts, bundled model
configs, the schema, the demo), and installed into a fresh venv it plans from any folder, offline.

The fresh venv gets no packages from an index: the wheel is installed with --no-deps, and a .pth file makes
this venv's site-packages (torch, deepspeed, transformers ...) importable after its own. Python does not
read .pth files inside a folder that a .pth line adds, so this venv's editable install of offload-launch
stays out, and `launcher` must come from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from launcher import recipes
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # the wheel build: `make test-fast` leaves them out, `make test` runs them


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(dist)], cwd=REPO)
    (built,) = dist.glob("offload_launch-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel: Path, tmp_path_factory) -> dict:
    """A new venv with only the wheel installed; this venv's dependencies visible through a .pth file."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "zz_offload_launch_test_deps.pth").write_text("".join(f"{path}\n" for path in ours))
    cwd = root / "elsewhere"  # outside the repository: nothing relative to the checkout can be found
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    env["XDG_CACHE_HOME"] = str(root / "cache")  # no model profile or validated config cached by the checkout
    return {"venv": venv, "python": python, "site": site, "cwd": cwd, "env": env}


def run_tool(fresh: dict, *args: str) -> dict:
    result = _run([str(fresh["venv"] / "bin" / "offload-launch"), *args], cwd=fresh["cwd"], env=fresh["env"])
    return json.loads(result.stdout)


def test_wheel_carries_every_data_file(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"launcher/templates/{p.name}" for p in (REPO / "templates").glob("*.json")}
    expected |= {f"launcher/recipes/{p.name}" for p in (REPO / "recipes").glob("*.yaml")}
    expected |= {f"launcher/recipes/hosts/{p.name}" for p in (REPO / "recipes" / "hosts").glob("*.yaml")}
    package = REPO / "launcher"
    for folder, pattern in (("models", "**/*.json"), ("schemas", "*.json"), ("demo", "**/*")):
        expected |= {
            f"launcher/{p.relative_to(package).as_posix()}" for p in (package / folder).glob(pattern) if p.is_file()
        }
    expected |= {f"launcher/{p.name}" for p in package.glob("*.py")}
    assert {
        "launcher/templates/base.json",
        "launcher/recipes/llama2-7b-1x24g.yaml",
        "launcher/recipes/hosts/1x-rtx4090-24g.yaml",
        "launcher/models/aliases.json",
        "launcher/schemas/ds_config.schema.json",
        "launcher/demo/tiny-llama/config.json",
        "launcher/demo/data/train.jsonl",
        "launcher/recipes.py",
    } <= expected
    assert expected - names == set()
    assert not any(name.startswith(("tests/", "recipes/", "templates/")) for name in names)


def test_fresh_venv_imports_launcher_from_the_wheel(fresh: dict):
    probe = (
        "import json, launcher, launcher.recipes as r;"
        "print(json.dumps({'launcher': launcher.__file__, 'recipes_module': r.__file__,"
        " 'recipe_dir': str(r.recipe_dir()), 'names': [x.name for x in r.available()],"
        " 'host': r.host_spec_path('1x-rtx4090-24g'), 'demo': r.find('tiny-demo').options}))"
    )
    result = _run([str(fresh["python"]), "-c", probe], cwd=fresh["cwd"], env=fresh["env"])
    found = json.loads(result.stdout)
    installed = fresh["site"] / "launcher"
    assert Path(found["launcher"]) == installed / "__init__.py"  # not the repo's editable install
    assert Path(found["recipes_module"]) == installed / "recipes.py"  # the module, not the recipes/ data folder
    assert Path(found["recipe_dir"]) == installed / "recipes"
    assert found["names"] == recipes.names()
    assert Path(found["host"]) == installed / "recipes" / "hosts" / "1x-rtx4090-24g.yaml"
    # the demo recipe's package: paths point into the installed package, whatever the current folder
    assert Path(found["demo"]["model"]) == installed / "demo" / "tiny-llama"
    assert Path(found["demo"]["data"]) == installed / "demo" / "data" / "train.jsonl"
    assert (installed / "demo" / "tiny-llama" / "tokenizer.json").is_file() and Path(found["demo"]["data"]).is_file()


def test_installed_tool_plans_a_described_host_offline(fresh: dict):
    host = fresh["site"] / "launcher" / "recipes" / "hosts" / "1x-rtx4090-24g-192g.yaml"
    data = run_tool(fresh, "--model", "meta-llama/Llama-2-7b", "--host-spec", str(host), "--dry-run", "--json")
    assert data["model"]["params"] == 6_738_415_616  # from the bundled config inside the wheel
    assert data["strategy"]["label"] == "ZeRO-2 + opt->cpu"
    assert data["ds_config"]["zero_optimization"]["stage"] == 2  # rendered from the wheel's templates


def test_installed_tool_runs_a_bundled_recipe(fresh: dict):
    data = run_tool(fresh, "--recipe", "llama2-7b-1x24g", "--dry-run", "--json")
    assert data["strategy"]["label"] == recipes.find("llama2-7b-1x24g").expect["strategy"] == "ZeRO-2 + opt->cpu"
    hosts = fresh["site"] / "launcher" / "recipes" / "hosts"
    assert data["host"]["source"] == str(hosts / "1x-rtx4090-24g-192g.yaml")
