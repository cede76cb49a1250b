"""scripts/wheelhouse_requirements.py: what `make wheelhouse` downloads for an air-gapped GPU host."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("wheelhouse_requirements", REPO / "scripts/wheelhouse_requirements.py")
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)


def report(*names: str) -> dict:
    """pip's installation report (--report), as much of it as the script reads."""
    return {"install": [{"metadata": {"name": name, "version": "1.0"}} for name in names]}


def test_every_dependency_of_the_package_is_downloaded_but_torchs_cuda_stack():
    declared = [r for r in importlib.metadata.requires("offload-launch") if "extra ==" not in r]  # pyproject's
    names = [re.match(r"[A-Za-z0-9_.-]+", d)[0].lower().replace("_", "-") for d in declared]
    cuda = ["nvidia-cublas-cu12", "nvidia-nccl-cu12", "cuda-bindings", "triton"]
    kept = wheelhouse.requirements(report(*names, *cuda, "deepspeed", "offload-launch"), ["torch", "transformers"])
    expected = [n for n in names if n not in ("torch", "transformers", "deepspeed")]
    assert kept == [f"{n}==1.0" for n in expected] + ["triton==1.0"]  # triton is skipped by SKIP, not here
    assert "nvidia-ml-py==1.0" in kept  # NVML's binding: a dependency, not torch's CUDA stack (it was dropped)
