"""Shared fixtures. Nothing here touches the network: hub lookups are forced offline, models are built
from transformers config classes into tmp_path, hardware is described in YAML."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach the hub; bundled configs and tmp_path models only
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# DeepSpeed JIT-compiles its ops (cpu_adam, async_io, shm_comm) into $XDG_CACHE_HOME/torch_extensions by
# default, keyed by name only: two checkouts with their own venvs would rebuild each other's ops. Tests keep
# them inside this venv (compiled once, shared by every test and every later run), and a test that points
# XDG_CACHE_HOME elsewhere (the probe cache) still finds them.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# offload-launch's own cache (probe figures, model profiles, validated configs) goes to a fresh folder, so
# tests neither read a developer's probe nor leave files in the home directory.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="offload-launch-tests-")

from tests.helpers import save_config, tiny_llama_config  # noqa: E402  (after the environment above)

# This machine's device selection and allocator settings must not reach what the tests plan and launch; a test
# that means them sets them itself. GPU-marked tests keep them: there they select the GPU under test.
ENVIRONMENT_TESTS_SET = ("CUDA_VISIBLE_DEVICES", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@pytest.fixture(autouse=True)
def _no_device_selection(request, monkeypatch):
    if request.node.get_closest_marker("gpu") is None:
        for name in ENVIRONMENT_TESTS_SET:
            monkeypatch.delenv(name, raising=False)
    else:  # a GPU test and what it starts run on the GPU: DeepSpeed picks CUDA itself when nothing pins it
        monkeypatch.delenv("DS_ACCELERATOR", raising=False)


@pytest.fixture
def tiny_llama_dir(tmp_path: Path) -> Path:
    return save_config(tiny_llama_config(), tmp_path / "tiny-llama")


@pytest.fixture
def write_host(tmp_path: Path):
    """Write a described host (YAML text) and return its path."""

    def write(text: str, name: str = "host.yaml") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write
