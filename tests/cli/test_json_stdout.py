"""--json prints exactly one JSON object on stdout on every path, library logging on stderr. Through a real
process (not CliRunner): DeepSpeed's logger and compiled code write to file descriptor 1 directly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

BAD_CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stgae": 3}}  # DeepSpeedZeroConfig refuses it


def offload_launch(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def one_object(proc: subprocess.CompletedProcess) -> dict:
    data = json.loads(proc.stdout)  # fails on anything before or after the object
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("args", "exit_code", "key"),
    [
        # a training dry run on this CPU-only host: DeepSpeed warns "Setting accelerator to CPU" on the way
        (("--recipe", "tiny-demo", "--dry-run", "--json"), 0, "strategy"),
        (("--model", "launcher/demo/tiny-llama", "--json"), 0, "strategy"),  # plan only, live host
        (("--model", "meta-llama/Llama-2-7b", "--host-spec", "1x-rtx4090-24g", "--json"), 0, "strategy"),
        (("--model", "meta-llama/Llama-2-70b-hf", "--host-spec", "cpu-only", "--dry-run", "--json"), 3, "candidates"),
    ],
    ids=["train-dry-run", "plan-live", "plan-described", "does-not-fit"],
)
def test_run_json_is_one_object(args, exit_code, key):
    proc = offload_launch(*args)
    assert proc.returncode == exit_code, proc.stderr[-2000:]
    assert key in one_object(proc)


def test_check_json_is_one_object_with_errors_too(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(BAD_CONFIG))
    proc = offload_launch("check", str(path), "--model", "launcher/demo/tiny-llama", "--json")
    assert proc.returncode == 2
    data = one_object(proc)
    assert data["errors"] >= 1 and proc.stderr.strip().splitlines()[-1].startswith("Error: ")


# `probe --quick --json` is parsed the same way in tests/inspection/test_rates.py; `--smoke --json` in
# tests/e2e/test_smoke.py; a training run's --json in tests/e2e/test_json_train.py.
