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
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import REPO, host_path


def live(plan, **host_changes):
    """The plan as if its host were this machine (preflight only checks live hosts)."""
    return replace(plan, host=replace(plan.host, source="live", **host_changes))


@pytest.fixture(scope="module")
def llama7b_on_a100():
    return make_plan(
        inspect_model("meta-llama/Llama-2-7b"),
        (h := load_host_spec(host_path("1x-a100-80g"))),
        Workload(),
        resolve_rates(h),
    )


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


@pytest.fixture
def bound_by_memlock(monkeypatch):
    """This process as an unprivileged one: without CAP_IPC_LOCK the limit binds (root here has it)."""
    monkeypatch.setattr(preflight, "can_lock_unlimited", lambda: False)
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)


@pytest.fixture(scope="module")
def llama70b_nvme_plan():
    text = "gpus: {count: 1, memory: 80GiB, name: A100}\ncpu_memory: 512GiB\nnvme: {path: /mnt/nvme, free: 2TiB}\n"
    return _plan_from_text(inspect_model("meta-llama/Llama-2-70b-hf"), text)


def _plan_from_text(model, text, **workload):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "host.yaml"
        path.write_text(text)
        return make_plan(model, (h := load_host_spec(str(path))), Workload(**workload), resolve_rates(h))


def test_memlock_does_not_bound_torch_pinned_cpu_offload(llama7b_on_a100, bound_by_memlock):
    """cudaHostAlloc'd pages are not charged to RLIMIT_MEMLOCK: CPU offload with pin_memory runs under 64 KiB."""
    assert llama7b_on_a100.pin_memory and llama7b_on_a100.chosen.strategy.offload_optimizer == "cpu"
    problems = preflight.find_problems(live(llama7b_on_a100, memlock_bytes=64 * 1024))
    assert not [p for p in problems if p.check == "memlock"]


def test_memlock_below_the_nvme_swap_buffers(llama70b_nvme_plan, bound_by_memlock):
    plan = live(llama70b_nvme_plan, memlock_bytes=64 * 1024)
    memlock = next(p for p in preflight.find_problems(plan) if p.check == "memlock")
    assert memlock.fatal and memlock.message.startswith("memlock limit 64.0 KiB < ")
    assert "NVMe swap buffers DeepSpeed mlocks per rank" in memlock.message
    assert "ulimit -l unlimited" in memlock.message and "pin_memory" not in memlock.message.split("(")[0]


def test_memlock_is_checked_for_nvme_on_the_cpu_accelerator_too(tiny_llama_dir, tmp_path, bound_by_memlock):
    """The aio buffers are mlocked whatever pin_memory says: pin_memory is off on the CPU accelerator, the
    check still runs."""
    text = f"gpus: {{count: 0}}\ncpu_memory: 64GiB\ncpu_cores: 8\nnvme: {{path: {tmp_path}, free: 100GiB}}\n"
    plan = _plan_from_text(inspect_model(str(tiny_llama_dir)), text, offload_optimizer="nvme", seq_len=64)
    assert plan.pin_memory is False and plan.chosen.strategy.offload_optimizer == "nvme"
    problems = preflight.find_problems(live(plan, memlock_bytes=4096))
    assert any(p.check == "memlock" and "NVMe swap buffers" in p.message for p in problems)


def test_native_pin_backend_is_charged_to_memlock(llama7b_on_a100, bound_by_memlock, monkeypatch):
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    problems = preflight.find_problems(live(llama7b_on_a100, memlock_bytes=64 * 1024))
    memlock = next(p for p in problems if p.check == "memlock")
    assert "DS_PIN_MEMORY_BACKEND=native" in memlock.message and "ulimit -l unlimited" in memlock.message


@pytest.fixture
def no_cuda_toolkit(monkeypatch):
    """A pip-only CUDA torch: torch says CUDA 12.4, no toolkit anywhere, no op prebuilt in the wheel."""
    monkeypatch.setattr(preflight, "_torch_cuda_version", lambda: "12.4")
    monkeypatch.setattr(preflight, "_cuda_home", lambda: None)
    monkeypatch.setattr(preflight, "_prebuilt_ops", lambda: {})
    monkeypatch.setattr(preflight, "aio_usable", lambda: True)


def _toolkit_problem(plan, config=None):
    return next((p for p in preflight.find_problems(plan, config=config) if p.check == "cuda_toolkit"), None)


def llama7b_on_8_a100s():
    """Llama-2-7B on 8 x A100-80GB, as if probed live: nothing offloaded."""
    host = load_host_spec(host_path("8x-a100-80g"))
    return live(make_plan(inspect_model("meta-llama/Llama-2-7b"), host, Workload(), resolve_rates(host)))


def test_gpu_plan_without_offload_needs_no_cuda_toolkit(no_cuda_toolkit):
    plan = llama7b_on_8_a100s()
    assert not plan.chosen.strategy.offloads
    assert preflight.cuda_ops_needed(plan) == []
    assert _toolkit_problem(plan) is None


def test_config_that_turns_torch_adam_off_needs_nvcc_for_fused_adam(no_cuda_toolkit):
    from launcher.config import dsconfig

    plan = llama7b_on_8_a100s()
    config = dsconfig.render(plan)
    config["optimizer"]["params"].pop("torch_adam")
    problem = _toolkit_problem(plan, config)
    assert problem is not None and problem.fatal and problem.exit_code == 2
    assert problem.message.startswith("DeepSpeed must compile its fused_adam op for this GPU plan, but no CUDA")
    assert "CUDA toolkit 12.4" in problem.message
    # the A100's own architecture: DeepSpeed's prebuild defaults (6.0;6.1;7.0...) fail under CUDA 13's nvcc
    prebuild = (
        "TORCH_CUDA_ARCH_LIST=8.0 DS_BUILD_FUSED_ADAM=1 pip install --no-build-isolation --no-cache-dir deepspeed"
    )
    assert problem.message.endswith(f"({prebuild})")


def test_nvme_on_a_gpu_needs_nvcc_for_async_io(llama70b_nvme_plan, no_cuda_toolkit):
    problem = _toolkit_problem(live(llama70b_nvme_plan))
    assert problem is not None and "compile its async_io op" in problem.message
    assert "CUDA_HOME" in problem.message and "DS_BUILD_AIO=1" in problem.message


def test_nvcc_of_another_cuda_major_is_named(llama70b_nvme_plan, no_cuda_toolkit, monkeypatch):
    monkeypatch.setattr(preflight, "_cuda_home", lambda: "/usr/local/cuda-11.8")
    monkeypatch.setattr(preflight, "_nvcc_release", lambda home: "11.8")
    problem = _toolkit_problem(live(llama70b_nvme_plan))
    assert "nvcc at /usr/local/cuda-11.8 is CUDA 11.8 and torch is built for CUDA 12.4" in problem.message
    monkeypatch.setattr(preflight, "_nvcc_release", lambda home: "12.6")
    assert _toolkit_problem(live(llama70b_nvme_plan)) is None


def test_a_prebuilt_op_needs_no_toolkit(llama70b_nvme_plan, no_cuda_toolkit, monkeypatch):
    monkeypatch.setattr(preflight, "_prebuilt_ops", lambda: {"async_io": True})
    import deepspeed.git_version_info as info

    monkeypatch.setattr(info, "accelerator_name", "cuda")
    assert _toolkit_problem(live(llama70b_nvme_plan)) is None


def test_nvcc_release_is_read_like_deepspeed_reads_it(tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    assert preflight._nvcc_release(str(tmp_path)) == "12.4"
    assert preflight._nvcc_release(str(tmp_path / "none")) is None


def test_shm_too_small_for_cpu_ranks(tiny_llama_dir, small_shm):
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := inspect_host()),
        Workload(num_gpus=2, seq_len=64),
        resolve_rates(h),
    )
    shm = next(p for p in preflight.find_problems(plan) if p.check == "shm")
    assert "2 ranks on this node need 132.0 MiB" in shm.message and "--shm-size=1g" in shm.message


def test_real_run_stops_on_a_failed_check_before_writing_anything(small_shm, tmp_path):
    """The host's checks come after the inputs' (the model with its tokenizer and the data read fine here),
    and before anything is written."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    out = tmp_path / "out"
    model = REPO / "launcher" / "demo" / "tiny-llama"
    args = ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--num-gpus", "2"]
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
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := inspect_host()),
        Workload(offload_optimizer="cpu", seq_len=64),
        resolve_rates(h),
    )
    assert [p for p in preflight.find_problems(plan) if p.check in ("cpu_adam", "async_io")] == []
    assert preflight.cpu_adam_buildable()


def test_unusable_async_io_names_the_package(tiny_llama_dir, tmp_path, monkeypatch):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    plan = make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := inspect_host(str(nvme))),
        Workload(zero_stage="3", offload_param="nvme", nvme_path=str(nvme), seq_len=64),
        resolve_rates(h),
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
