"""The launch command as argv (never started here), the run folder rules, and checkpoint bookkeeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.files import write_json_atomic
from launcher.inspection.cuda_devices import RANK_DEVICES_ENV
from launcher.job import binding, launch, rundir
from launcher.rank.checkpoints import COMPLETE_MARKER, complete_checkpoints, trim_metrics
from tests.helpers import host_path


def spec(**kw) -> launch.LaunchSpec:
    fields = dict(
        run_spec_path="/runs/x/run_spec.json", ranks_per_node=2, accelerator="cpu", cpu_cores=8, master_port=29611
    )
    fields.update(kw)
    return launch.LaunchSpec(**fields)


def test_single_node_command():
    argv, env = launch.build_command(spec())
    assert argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert argv[3:] == [
        "--num_nodes",
        "1",
        "--num_gpus",
        "2",
        "--master_port",
        "29611",
        "--no_local_rank",
        "--module",
        "launcher.rank",
        "--run-spec",
        "/runs/x/run_spec.json",
    ]
    assert env["OMP_NUM_THREADS"] == "4"  # 8 cores / 2 ranks, for torch and CPU-Adam
    assert env["DS_ACCELERATOR"] == "cpu"


def test_multi_node_command_with_launcher_args():
    argv, env = launch.build_command(
        spec(
            accelerator="cuda",
            hostfile="hosts.txt",
            launcher="openmpi",
            master_addr="10.0.0.1",
            bind_cores=True,
            extra_args=("--ssh_port", "2222"),
        )
    )
    joined = " ".join(argv)
    assert "--hostfile hosts.txt --launcher openmpi" in joined
    assert "--num_nodes" not in argv  # the hostfile says how many
    assert "--master_addr 10.0.0.1" in joined and "--bind_cores_to_rank" in argv
    assert joined.index("--ssh_port 2222") < joined.index("--module")  # ours go to DeepSpeed's launcher
    assert "DS_ACCELERATOR" not in env


def test_format_command_is_a_shell_line():
    argv, env = launch.build_command(spec(run_spec_path="/runs/my run/run_spec.json"))
    line = launch.format_command(argv, env)
    assert line.startswith("DS_ACCELERATOR=cpu OMP_NUM_THREADS=4")
    assert "'/runs/my run/run_spec.json'" in line


def test_free_port_is_bindable():
    import socket

    port = launch.free_port()
    with socket.socket() as sock:
        sock.bind(("", port))


def test_dry_run_prints_the_multi_node_command(tmp_path, tiny_llama_dir):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# two machines\nnode-a slots=8\nnode-b slots=8\n")
    result = CliRunner().invoke(
        cli,
        [
            "--model",
            str(tiny_llama_dir),
            "--data",
            str(data),
            "--hostfile",
            str(hosts),
            "--host-spec",
            host_path("8x-a100-80g"),
            "--master-addr",
            "node-a",
            "--output-dir",
            str(tmp_path / "out"),
            "--dry-run",
            "--",
            "--ssh_port",
            "2222",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "--hostfile " + str(hosts) in result.output and "--launcher pdsh" in result.output
    assert "--ssh_port 2222" in result.output and "--master_addr node-a" in result.output
    assert "world 16" in result.output  # 2 nodes x 8 GPUs from the hostfile
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_empty_hostfile(tmp_path, tiny_llama_dir):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# nobody\n")
    result = CliRunner().invoke(
        cli, ["--model", str(tiny_llama_dir), "--data", str(hosts), "--hostfile", str(hosts), "--dry-run"]
    )
    assert result.exit_code == 2 and "lists no hosts" in result.output


def test_swap_dir_is_per_run_and_stable(tmp_path):
    a1 = rundir.swap_dir("/nvme", str(tmp_path / "a"))
    assert a1 == rundir.swap_dir("/nvme", str(tmp_path / "a"))
    assert a1 != rundir.swap_dir("/nvme", str(tmp_path / "b"))
    assert a1.startswith("/nvme/offload-launch-")


def test_half_written_checkpoints_are_never_picked(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):
        tag = tmp_path / f"step{step}"
        tag.mkdir()
        (tag / "model_states.pt").write_text("x")
        if complete:
            write_json_atomic(tag / COMPLETE_MARKER, {"step": step})
    (tmp_path / "step8").mkdir()
    (tmp_path / "step8" / COMPLETE_MARKER).write_text('{"step": 8')  # torn marker write
    assert complete_checkpoints(tmp_path) == [(2, "step2"), (4, "step4")]


def test_metrics_are_trimmed_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')
    trim_metrics(path, 4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_epochs_become_optimizer_steps():
    from launcher.inspection.hostspec import load_host_spec
    from launcher.inspection.model import inspect_model
    from launcher.job.prepare import steps_for_epochs
    from launcher.plan.planner import make_plan
    from launcher.plan.rates import resolve_rates
    from launcher.plan.workload import Workload

    plan = make_plan(
        inspect_model("gpt2"),
        (h := load_host_spec(host_path("8x-a100-80g"))),
        Workload(micro_batch=2, grad_accum=4, seq_len=512),
        resolve_rates(h),
    )
    # 8 ranks x 2 sequences x 4 micro-batches = 64 blocks per optimizer step
    assert steps_for_epochs(1, 640, plan) == 10
    assert steps_for_epochs(1.5, 640, plan) == 15
    assert steps_for_epochs(1, 650, plan) == 11  # a partial last step still runs
    assert steps_for_epochs(0.01, 640, plan) == 1


def test_the_runs_shared_memory_buffers_are_removed_and_no_others(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(launch, "SHM_DIR", tmp_path)
    uid = os.getuid()
    ours = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29511_{rank}" for rank in (0, 1)]
    other_port = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29512_0"
    other_user = tmp_path / f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_29511_0"
    for path in (*ours, other_port, other_user):
        path.write_bytes(b"\0" * 16)
    removed = launch.remove_shm_buffers(["python", "-m", "deepspeed.launcher.runner", "--master_port", "29511"])
    assert sorted(removed) == sorted(ours)
    assert other_port.exists() and other_user.exists() and not any(p.exists() for p in ours)


def dry_run(tmp_path, tiny_llama_dir, host: str, *args: str):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    return CliRunner().invoke(
        cli,
        ["--model", str(tiny_llama_dir), "--data", str(data), "--host-spec", host_path(host)]
        + ["--output-dir", str(tmp_path / "out"), "--dry-run", *args],
    )


def live_launch(tmp_path, tiny_llama_dir, host: str, **typed) -> launch.LaunchSpec:
    """prepare.launch_spec for a plan made for `host` as if this machine had been probed live with it (the
    CUDA host a GPU-less test machine cannot be)."""
    from dataclasses import replace
    from pathlib import Path

    from launcher import settings
    from launcher.job import prepare
    from launcher.job.planning import build_plan

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    base = {"model": str(tiny_llama_dir), "data": str(data), "output_dir": str(tmp_path / "out")}
    chosen = settings.layer({**base, "host_spec": host_path(host), **typed})
    plan = build_plan(chosen)
    plan = replace(plan, host=replace(plan.host, source="live"))
    return prepare.launch_spec(plan, chosen, Path(chosen.output_dir), ())


def test_cuda_visible_devices_become_deepspeeds_include(tmp_path, tiny_llama_dir, monkeypatch):
    """DeepSpeed's runner drops CUDA_VISIBLE_DEVICES when --num_gpus is given and uses GPUs 0..N-1; the
    selection must reach it as --include, without --num_gpus/--num_nodes (which it refuses beside it)."""
    argv, env = launch.build_command(spec(accelerator="cuda", devices=(1, 3)))
    assert argv[3:7] == ["--include", "localhost:1,3", "--master_port", "29611"]
    assert "--num_gpus" not in argv and "--num_nodes" not in argv
    assert "DS_ACCELERATOR" not in env and "CUDA_DEVICE_ORDER" not in env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    live = live_launch(tmp_path, tiny_llama_dir, "4x-a100-40g", num_gpus=2)
    assert live.devices == (1, 3) and not live.pci_bus_order
    argv, _ = launch.build_command(live)
    assert "--include" in argv and argv[argv.index("--include") + 1] == "localhost:1,3"
    assert "--num_gpus" not in argv and "--num_nodes" not in argv


def test_a_described_host_is_not_given_this_machines_gpu_selection(tmp_path, tiny_llama_dir, monkeypatch):
    """--host-spec describes another machine: this machine's CUDA_VISIBLE_DEVICES neither selects its GPUs nor
    refuses its plan (a dry run of a 4-GPU host from a laptop with one GPU selected is a plan, not a launch)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    result = dry_run(tmp_path, tiny_llama_dir, "4x-a100-40g")  # 4 ranks, 2 GPUs selected here
    assert result.exit_code == 0, result.output
    assert "--num_nodes 1 --num_gpus 4 --master_port" in result.output and "--include" not in result.output
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = dry_run(tmp_path, tiny_llama_dir, "1x-a100-40g")
    assert result.exit_code == 0, result.output
    assert "--num_nodes 1 --num_gpus 1 --master_port" in result.output


def test_gpus_named_by_uuid_are_included_by_pci_bus_index():
    argv, env = launch.build_command(spec(accelerator="cuda", ranks_per_node=1, devices=(2,), pci_bus_order=True))
    assert argv[3:5] == ["--include", "localhost:2"] and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_mig_instance_named_by_uuid_reaches_the_rank_by_uuid(tmp_path):
    """DeepSpeed's launch.py gives the rank CUDA_VISIBLE_DEVICES=1 (its GPU's index, integers only), which CUDA reads
    as GPU 1's first MIG instance: the chosen one travels beside it, the printed command shows it, and the rank
    puts it back before CUDA starts."""
    mig = spec(accelerator="cuda", ranks_per_node=1, devices=(1,), pci_bus_order=True, rank_devices="MIG-0e0e-2222")
    argv, env = launch.build_command(mig)
    assert argv[3:5] == ["--include", "localhost:1"] and env[RANK_DEVICES_ENV] == "MIG-0e0e-2222"
    assert f"{RANK_DEVICES_ENV}=MIG-0e0e-2222" in launch.format_command(argv, env)
    restored = subprocess.run(
        [sys.executable, "-c", "import os, launcher.rank.__main__; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1", RANK_DEVICES_ENV: "MIG-0e0e-2222"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert restored.stdout.strip() == "MIG-0e0e-2222"


def test_cuda_without_cuda_visible_devices_is_unchanged(tmp_path, tiny_llama_dir, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = dry_run(tmp_path, tiny_llama_dir, "4x-a100-40g", "--num-gpus", "2")
    assert result.exit_code == 0, result.output
    assert "--num_nodes 1 --num_gpus 2 --master_port" in result.output and "--include" not in result.output


def test_a_device_selection_leaves_the_cpu_accelerator_and_hostfiles_unchanged(tmp_path, tiny_llama_dir, monkeypatch):
    argv, env = launch.build_command(spec(accelerator="cpu", devices=(1, 3)))
    assert argv[3:7] == ["--num_nodes", "1", "--num_gpus", "2"] and env["DS_ACCELERATOR"] == "cpu"
    argv, _ = launch.build_command(spec(accelerator="cuda", devices=(1, 3), hostfile="hosts.txt"))
    assert "--include" not in argv and argv[argv.index("--num_gpus") + 1] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only")
    assert result.exit_code == 0, result.output
    assert "DS_ACCELERATOR=cpu" in result.output and "--num_nodes 1 --num_gpus 1 --master_port" in result.output


def test_a_selection_too_small_for_the_plan_is_refused(tmp_path, tiny_llama_dir, monkeypatch):
    from launcher.errors import UserInputError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    with pytest.raises(UserInputError, match=r"selects 2 GPU\(s\), but the plan is for 4 rank\(s\)"):
        live_launch(tmp_path, tiny_llama_dir, "4x-a100-40g")  # this machine's 4 GPUs, 4 ranks
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserInputError, match="leaves no GPU visible"):
        live_launch(tmp_path, tiny_llama_dir, "1x-a100-40g")


def test_the_conftest_keeps_this_machines_gpu_selection_out_of_the_tests():
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ


def test_the_runner_is_started_without_cuda_visible_devices_when_include_names_them():
    import sys

    probe = "import os, sys; sys.exit(3 if 'CUDA_VISIBLE_DEVICES' in os.environ else 0)"
    base = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1,3"}
    assert launch.run([sys.executable, "-c", probe, "--include", "localhost:1,3"], {}, base) == 0
    assert launch.run([sys.executable, "-c", probe, "--num_gpus", "2"], {}, base) == 3  # kept otherwise


@pytest.mark.parametrize(("devices", "expected"), [((1, 3), [1, 3]), (None, [0, 1])])
def test_deepspeeds_runner_puts_the_ranks_on_the_selected_gpus(monkeypatch, devices, expected):
    """DeepSpeed's own runner main() on our argv, with CUDA_VISIBLE_DEVICES=1,3 on a 4-GPU node (its
    accelerator and Popen replaced): the world it hands deepspeed.launcher.launch, which writes each rank's
    CUDA_VISIBLE_DEVICES. With --num_gpus (no selection) it is 0,1 whatever the variable said."""
    import base64
    import json as json_module
    from types import SimpleNamespace

    from deepspeed.launcher import runner

    started = []

    class Popen:
        def __init__(self, cmd, env):
            started.append((cmd, env))
            self.returncode = 0

        def wait(self):
            return 0

    accelerator = SimpleNamespace(visible_devices_envs=lambda: ["CUDA_VISIBLE_DEVICES"], device_count=lambda: 4)
    monkeypatch.setattr(runner, "get_accelerator", lambda: accelerator)
    monkeypatch.setattr(runner.subprocess, "Popen", Popen)
    monkeypatch.setattr(runner, "fetch_hostfile", lambda _path: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    argv, _ = launch.build_command(spec(accelerator="cuda", devices=devices))
    runner.main(argv[3:])
    ((cmd, env),) = started
    world = next(a for a in cmd if a.startswith("--world_info="))
    assert json_module.loads(base64.urlsafe_b64decode(world.split("=", 1)[1])) == {"localhost": expected}
    assert "CUDA_VISIBLE_DEVICES" not in env  # the runner deleted it: launch.py sets it per rank from the world


def test_the_ranks_get_the_allocator_setting_the_plan_counted():
    from launcher.plan import host_buffers

    spec = launch.LaunchSpec(
        run_spec_path="/o/run_spec.json",
        ranks_per_node=1,
        accelerator="cuda",
        cpu_cores=8,
        master_port=29500,
        alloc_conf=host_buffers.PINNED_ALLOC_CONF,
    )
    assert launch.build_command(spec)[1]["PYTORCH_ALLOC_CONF"] == host_buffers.PINNED_ALLOC_CONF
    unset = launch.build_command(launch.LaunchSpec("/o/run_spec.json", 1, "cuda", 8, 29500))[1]
    assert "PYTORCH_ALLOC_CONF" not in unset


def test_bound_ranks_get_deepspeeds_flag_before_the_entry_point_and_keep_their_thread_share():
    argv, env = launch.build_command(spec(bind_cores=True))
    assert argv[3:10] == ["--num_nodes", "1", "--num_gpus", "2", "--master_port", "29611", "--bind_cores_to_rank"]
    assert argv[10:12] == ["--no_local_rank", "--module"]  # DeepSpeed's runner reads it as its own option
    assert env["OMP_NUM_THREADS"] == "4"  # 8 cores / 2 ranks: the share DeepSpeed's numa.py binds each rank to
    assert "--bind_cores_to_rank" not in launch.build_command(spec())[0]


def with_numactl(monkeypatch, installed: bool) -> None:

    real = binding.shutil.which
    path = "/usr/bin/numactl" if installed else None
    monkeypatch.setattr(binding.shutil, "which", lambda name, *a, **k: path if name == "numactl" else real(name))


def test_dry_run_shows_core_binding_when_the_optimizer_is_offloaded(tmp_path, tiny_llama_dir, monkeypatch):
    with_numactl(monkeypatch, True)
    offload = ("--zero-stage", "2", "--offload-optimizer", "cpu", "--num-gpus", "2")
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only", *offload)
    assert result.exit_code == 0, result.output
    command = result.stdout.strip().splitlines()[-1]
    assert "--master_port" in command and "--bind_cores_to_rank --no_local_rank" in command
    assert "binding each rank to its share of the cores" in result.stderr and "--no-bind-cores" in result.stderr
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only", *offload, "--no-bind-cores")
    assert result.exit_code == 0 and "--bind_cores_to_rank" not in result.output
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only", "--offload-optimizer", "none")
    assert result.exit_code == 0 and "--bind_cores_to_rank" not in result.output and "numactl" not in result.output


def test_dry_run_without_numactl_says_once_that_it_would_bind(tmp_path, tiny_llama_dir, monkeypatch):
    with_numactl(monkeypatch, False)
    offload = ("--zero-stage", "2", "--offload-optimizer", "cpu")
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only", *offload)
    assert result.exit_code == 0, result.output
    assert "--bind_cores_to_rank" not in result.stdout and result.stderr.count("installing numactl") == 1
    result = dry_run(tmp_path, tiny_llama_dir, "cpu-only", *offload, "--bind-cores")
    assert result.exit_code == 2 and "--bind-cores needs numactl" in result.output


def test_slurm_launcher_command():
    """DeepSpeed's SlurmRunner runs `srun -n N [--gpus-per-node G] python -u <user_script> <args>`: no ssh, no
    --module, none of torch.distributed's variables. The ranks' script is sbatch.py, which sets them from srun's."""
    from launcher.job import sbatch

    argv, env = launch.build_command(
        spec(accelerator="cuda", hostfile="hosts.txt", launcher="slurm", master_addr="node-a", ranks_per_node=8)
    )
    assert argv[3:10] == ["--hostfile", "hosts.txt", "--launcher", "slurm", "--num_gpus", "8", "--no_ssh_check"]
    assert argv[-3:] == [sbatch.RANK_SCRIPT, "--run-spec", "/runs/x/run_spec.json"] and "--module" not in argv
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node-a", "29611")  # srun passes the runner's environment
    cpu, _ = launch.build_command(spec(hostfile="hosts.txt", launcher="slurm", master_addr="node-a"))
    assert "--num_gpus" not in cpu  # SlurmRunner would ask srun for --gpus-per-node: the hostfile's slots count
    pdsh, pdsh_env = launch.build_command(spec(hostfile="hosts.txt", launcher="pdsh", master_addr="node-a"))
    assert pdsh[-4:-2] == ["--module", "launcher.rank"] and "MASTER_ADDR" not in pdsh_env
