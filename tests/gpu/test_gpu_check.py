"""`make gpu-check` for real on one CUDA GPU: the probe measures the GPU, every strategy family's smoke run
passes, and each prediction is within a band of what was measured.

Bands (measured / predicted): GPU memory [0.85, 1.15] (issue 13's target; the memory model counts a CUDA
context the allocator's reserved peak does not see, so a miss here is a finding, not noise); CPU memory
[0.5, 1.5]; step time [0.33, 3] (the step model is a race of coarse rates)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO = Path(__file__).resolve().parents[2]
BANDS = {"gpu_bytes_per_device": (0.85, 1.15), "cpu_bytes_per_node": (0.5, 1.5), "step_seconds": (0.33, 3.0)}


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("gpu-check")
    out = work / "gpu-check.json"
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--own-cache", "--work", str(work), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    print(proc.stderr[-6000:])
    assert out.is_file(), proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_the_probe_measures_the_gpu(check):
    probe = check["probe"]
    assert probe["ok"], probe.get("error")
    figures = probe["figures"]
    for kind in ("pinned", "pageable"):
        for direction in ("h2d", "d2h"):
            assert figures[f"pcie_{kind}_{direction}_bytes_per_s"] > 1e9
    assert figures["gpu_matmul_flops_per_s"] > 10e12  # any training GPU does 10 bf16 TFLOP/s at 4096 wide
    assert probe["gpu_matmul"]["shapes"] == [[4096, 11008]] and probe["gpu_matmul"]["shapes_from"] == "model"
    assert figures["cpu_adam_params_per_s"] > 1e7


def test_every_strategy_passes_within_its_bands(check):
    assert check["device"]["accelerator"] == "cuda"
    ran = [r for r in check["runs"] if "skipped" not in r]
    assert len(ran) >= 4
    misses = []
    for run in ran:
        assert run["passed"], f"{run['strategy']}: {run.get('failed_check')} {run.get('error', '')[-2000:]}"
        for figure, (low, high) in BANDS.items():
            ratio = run[figure]["measured_over_predicted"]
            print(f"{run['strategy']:<40} {figure:<22} {ratio}")
            if ratio is None or not low <= ratio <= high:
                misses.append(f"{run['strategy']} {figure}: {ratio} not in [{low}, {high}]")
    assert not misses, "\n".join(misses)


def test_it_ran_in_under_eight_minutes(check):
    assert check["seconds"] < 8 * 60
