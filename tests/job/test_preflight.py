"""Host checks just before launch: each failing check is one line with the value and the fix, and a real run
stops on it before anything is written or started."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.inspection.host import inspect_host
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.job import preflight
from launcher.plan.planner import Workload, make_plan
from tests.helpers import host_path


def live(plan, **host_changes):
    """The plan as if its host were this machine (preflight only checks live hosts)."""
    return replace(plan, host=replace(plan.host, source="live", **host_changes))


@pytest.fixture(scope="module")
def llama7b_on_a100():
    return make_plan(inspect_model("meta-llama/Llama-2-7b"), load_host_spec(host_path("1x-a100-80g")), Workload())


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A real 64 MiB tmpfs standing in for /dev/shm (root only)."""
    path = tmp_path / "shm"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    monkeypatch.setattr(preflight, "SHM_PATH", str(path))
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_described_hosts_are_not_checked(llama7b_on_a100):
    assert preflight.find_problems(llama7b_on_a100) == []


def test_ram_available_now_not_only_installed(llama7b_on_a100):
    problems = preflight.find_problems(live(llama7b_on_a100))
    ram = next(p for p in problems if p.check == "ram")
    assert ram.exit_code == 3 and ram.fatal
    assert "available now" in ram.message and "stop other jobs" in ram.message


def test_memlock_below_the_pinned_buffers(llama7b_on_a100):
    assert llama7b_on_a100.pin_memory and llama7b_on_a100.chosen.strategy.offloads
    problems = preflight.find_problems(live(llama7b_on_a100, memlock_bytes=64 * 1024))
    memlock = next(p for p in problems if p.check == "memlock")
    assert "memlock limit 64.0 KiB" in memlock.message and "ulimit -l unlimited" in memlock.message
    assert "pin_memory: false" in memlock.message


def test_shm_too_small_for_cpu_ranks(tiny_llama_dir, small_shm):
    plan = make_plan(inspect_model(str(tiny_llama_dir)), inspect_host(), Workload(num_gpus=2, seq_len=64))
    shm = next(p for p in preflight.find_problems(plan) if p.check == "shm")
    assert "2 ranks on this node need 132.0 MiB" in shm.message and "--shm-size=1g" in shm.message


def test_real_run_stops_on_a_failed_check_before_writing_anything(tiny_llama_dir, small_shm, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    out = tmp_path / "out"
    args = ["--model", str(tiny_llama_dir), "--data", str(data), "--output-dir", str(out), "--num-gpus", "2"]
    result = CliRunner().invoke(cli, [*args, "--seq-len", "64"])
    assert result.exit_code == 2, result.output
    assert "/dev/shm has" in result.output and "shared-memory communication" in result.output
    assert "Error: " in result.output and "--shm-size=1g" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_dry_run_prints_failed_checks_as_warnings(tiny_llama_dir, small_shm, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    args = ["--model", str(tiny_llama_dir), "--data", str(data), "--output-dir", str(tmp_path / "o"), "--num-gpus", "2"]
    result = CliRunner().invoke(cli, [*args, "--seq-len", "64", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "warning: /dev/shm has" in result.output


def test_ops_this_machine_builds(tiny_llama_dir):
    """async_io (libaio-dev, installed by make install) and CPU-Adam are usable here: no problem reported."""
    plan = make_plan(inspect_model(str(tiny_llama_dir)), inspect_host(), Workload(offload_optimizer="cpu", seq_len=64))
    assert [p for p in preflight.find_problems(plan) if p.check in ("cpu_adam", "async_io")] == []
    assert preflight.cpu_adam_buildable()


def test_unusable_async_io_names_the_package(tiny_llama_dir, tmp_path, monkeypatch):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        inspect_host(str(nvme)),
        Workload(zero_stage="3", offload_param="nvme", nvme_path=str(nvme), seq_len=64),
    )
    monkeypatch.setattr(preflight, "aio_usable", lambda: False)  # as on a machine without libaio
    aio = next(p for p in preflight.find_problems(plan) if p.check == "async_io")
    assert "apt-get install libaio-dev" in aio.message and "libaio-devel" in aio.message


def test_swap_folders_other_runs_left_are_reported_not_deleted(tmp_path):
    nvme = tmp_path / "nvme"
    mine, other = nvme / "offload-launch-aaaa", nvme / "offload-launch-bbbb"
    for folder, owner in ((mine, "/runs/mine"), (other, "/runs/killed")):
        folder.mkdir(parents=True)
        (folder / "owner.json").write_text(json.dumps({"output_dir": owner}))
        (folder / "swap.bin").write_bytes(b"\0" * 4096)
    problems = preflight.stale_swap_problems(str(nvme), str(mine))
    assert len(problems) == 1 and not problems[0].fatal
    assert str(other) in problems[0].message and "/runs/killed" in problems[0].message
    assert "rerun that run to resume" in problems[0].message and other.is_dir()
    assert Path(mine).is_dir()
