"""On one GPU: a few steps of each strategy family on a small model, peak GPU memory against the plan.

Run with `make gpu-smoke` (or `pytest -m gpu`); skipped cleanly where CUDA is not available."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import run_launch

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STRATEGIES = [
    ("2", "none", "none"),
    ("2", "cpu", "none"),
    ("3", "none", "none"),
    ("3", "cpu", "cpu"),
    ("3", "nvme", "nvme"),
]


@pytest.fixture(scope="module")
def small_model(tiny_model):
    """The e2e tokenizer with a wider model, so GPU memory is dominated by what the plan models."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 1024, 2816, 8
    config.num_attention_heads = config.num_key_value_heads = 8
    config.save_pretrained(tiny_model)
    return tiny_model


@pytest.mark.parametrize(("stage", "optimizer", "param"), STRATEGIES, ids=["-".join(s) for s in STRATEGIES])
def test_strategy_on_one_gpu_within_prediction(small_model, tiny_data, tmp_path, stage, optimizer, param):
    extra = ["--zero-stage", stage, "--offload-optimizer", optimizer, "--offload-param", param, "--steps", "4"]
    if "nvme" in (optimizer, param):
        from launcher.inspection.host import aio_usable

        if not aio_usable():
            pytest.skip("DeepSpeed async_io needs libaio-dev")
        (tmp_path / "nvme").mkdir()
        extra += ["--nvme-path", str(tmp_path / "nvme")]
    out = tmp_path / "run"
    run_launch(small_model, tiny_data, out, "--num-gpus", "1", *extra)
    run = json.loads((out / "run.json").read_text())
    predicted = run["predicted"]["gpu_bytes_per_device"]
    measured = run["measured"]["gpu_bytes_per_device"]
    ratio = measured / predicted
    print(
        f"ZeRO-{stage} opt={optimizer} param={param}: measured {measured / 2**20:.0f} MiB, "
        f"predicted {predicted / 2**20:.0f} MiB, ratio {ratio:.2f}"
    )
    assert run["final_loss"] < run["first_loss"]
    assert 0 < ratio <= 1.0, "the plan must be an upper bound of what the GPU really used"


def test_smoke_mode_on_one_gpu(small_model, tiny_data, tmp_path):
    """--smoke on the GPU: every check passes, and the memory check compares GPU memory too."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from tests.e2e.conftest import REPO

    xml = tmp_path / "smoke.xml"
    argv = [sys.executable, "-m", "launcher", "--model", str(small_model), "--data", str(tiny_data)]
    argv += ["--output-dir", str(tmp_path / "out"), "--smoke", "--json", "--junit-xml", str(xml), "--seq-len", "64"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    memory = next(c for c in report["checks"] if c["name"] == "memory")
    print(f"smoke on GPU: {report['strategy']}; {memory['message']}")
    assert "gpu_bytes_per_device" in memory["details"]["ratios"]
    assert ET.parse(xml).getroot().find("testsuite").get("failures") == "0"
