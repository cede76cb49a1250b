"""The launch command as argv (never started here), the run folder rules, and checkpoint bookkeeping."""

from __future__ import annotations

import json

from click.testing import CliRunner

from launcher.cli import cli
from launcher.files import write_json_atomic
from launcher.job import launch, rundir
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
    from launcher.plan.planner import Workload, make_plan

    plan = make_plan(
        inspect_model("gpt2"),
        load_host_spec(host_path("8x-a100-80g")),
        Workload(micro_batch=2, grad_accum=4, seq_len=512),
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
