"""The command line through Click's CliRunner: human output, the --json contract, exit codes."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from launcher.cli import cli
from tests.helpers import REPO, host_path

JSON_KEYS = {
    "version",
    "fits",
    "model",
    "host",
    "workload",
    "strategy",
    "memory",
    "capacity",
    "candidates",
    "reasons",
    "warnings",
    "ds_config",
}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_help_is_fast_and_shows_examples():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for option in (
        "--model",
        "--host-spec",
        "--dry-run",
        "--json",
        "--config-out",
        "--zero-stage",
        "--offload-optimizer",
        "--offload-param",
        "--nvme-path",
        "--seq-len",
    ):
        assert option in result.output
    assert "offload-launch --model meta-llama/Llama-2-7b --dry-run" in result.output
    top = invoke("--help")
    assert top.exit_code == 0 and "run" in top.output


def test_dry_run_human_output():
    result = invoke("--model", "meta-llama/Llama-2-7b", "--dry-run", "--host-spec", host_path("1x-rtx4090-24g"))
    assert result.exit_code == 0, result.output
    out = result.output
    # 128 GB RAM (124.2 GiB usable): ZeRO-2's optimizer in CPU RAM does not fit at its checkpoint save (fp32 states
    # and gradients, DeepSpeed's pinned 16-bit buffers and the 16-bit weights torch.save copies off the GPU); ZeRO-3
    # keeps a twentieth of the optimizer on the GPU and the rest fits - the Makefile's demo shows this plan
    assert "6,738,415,616" in out and "Candidates" in out and "> ZeRO-3 + opt->cpu 95%  " in out
    assert "ZeRO-2 + opt->cpu does not fit: CPU RAM needs" in out and "at the checkpoint save" in out
    assert '"zero_optimization"' in out and "Why" in out


def test_json_contract_and_config_out(tmp_path):
    out_file = tmp_path / "ds.json"
    result = invoke(
        "--model",
        "meta-llama/Llama-2-7b",
        "--dry-run",
        "--json",
        "--host-spec",
        host_path("1x-a100-80g"),
        "--config-out",
        str(out_file),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)  # exactly one JSON object on stdout
    assert set(data) >= JSON_KEYS
    assert data["model"]["params"] == 6_738_415_616
    assert data["model"]["largest_param_numel"] == 131_072_000
    # 80 GB has room for part of the optimizer beside ZeRO-3's partition: it stays there (DeepSpeed's Twin-Flow)
    assert data["strategy"] == {
        "zero_stage": 3,
        "offload_optimizer": "cpu",
        "offload_param": "none",
        "offload_ratio": 0.473684,
        "optimizer_states": "fp32",
        "label": "ZeRO-3 + opt->cpu 47%",
    }
    assert data["ds_config"]["zero_optimization"]["offload_optimizer"]["ratio"] == 0.473684
    for key in ("gpu_bytes_per_device", "cpu_bytes", "nvme_bytes"):
        assert isinstance(data["memory"][key], int)
    assert data["memory"]["nvme_bytes"] == 0
    assert data["candidates"][0]["label"] == "ZeRO-1" and data["candidates"][0]["fits"] is False
    assert all(isinstance(r, str) for r in data["reasons"])
    assert json.loads(out_file.read_text()) == data["ds_config"]


def test_local_model_directory(tiny_llama_dir):
    result = invoke("--model", str(tiny_llama_dir), "--dry-run", "--json", "--host-spec", host_path("cpu-only"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model"]["source"] == "local"


def test_does_not_fit_exits_3_with_the_table(write_host):
    host = write_host("gpus: {count: 1, memory: 8GiB}\ncpu_memory: 16GiB\n")
    result = invoke("--model", "meta-llama/Llama-2-70b-hf", "--dry-run", "--host-spec", host)
    assert result.exit_code == 3
    assert "Candidates" in result.output and "nothing fits" in result.output
    assert "does not fit this host" in result.output
    as_json = invoke("--model", "meta-llama/Llama-2-70b-hf", "--dry-run", "--json", "--host-spec", host)
    assert as_json.exit_code == 3
    payload = as_json.stdout
    data = json.loads(payload)
    assert data["fits"] is False and data["strategy"] is None and data["ds_config"] is None


def test_does_not_fit_writes_no_config(write_host, tmp_path):
    host = write_host("gpus: {count: 1, memory: 8GiB}\ncpu_memory: 16GiB\n")
    out_file = tmp_path / "ds.json"
    result = invoke(
        "--model", "meta-llama/Llama-2-70b-hf", "--dry-run", "--host-spec", host, "--config-out", str(out_file)
    )
    assert result.exit_code == 3 and not out_file.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "./no/such/dir"], "model path ./no/such/dir does not exist"),
        (["--model", "gpt2", "--zero-stage", "2", "--offload-param", "cpu"], "--offload-param cpu needs ZeRO-3"),
        (["--model", "gpt2", "--micro-batch", "0"], "--micro-batch must be at least 1"),
        (["--model", "gpt2", "--seq-len", "4096"], "exceeds openai-community/gpt2's max_position_embeddings 1024"),
        (["--model", "gpt2", "--host-spec", "nope.yaml"], "--host-spec nope.yaml does not exist"),
        (
            ["--model", "gpt2", "--offload-optimizer", "nvme", "--host-spec", host_path("cpu-only")],
            "NVMe offload needs --nvme-path",
        ),
    ],
)
def test_user_errors_are_one_line_exit_2(args, message):
    if "--host-spec" not in args:
        args = [*args, "--host-spec", host_path("1x-a100-80g")]
    result = invoke(*args, "--dry-run")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_unknown_host_key_names_the_nearest(write_host):
    host = write_host("gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64GiB\nnvme_path: /x\n")
    result = invoke("--model", "gpt2", "--dry-run", "--host-spec", host)
    assert (
        result.exit_code == 2 and "unknown key 'nvme_path'" in result.output and "did you mean 'nvme'" in result.output
    )


def test_console_script_runs_offline(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "--model",
            "meta-llama/Llama-2-7b",
            "--dry-run",
            "--json",
            "--host-spec",
            host_path("8x-a100-80g"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["strategy"]["zero_stage"] in (1, 2)


def _commands():
    from launcher.cli import cli as group

    return sorted(group.commands.items())


@pytest.mark.parametrize(("name", "command"), _commands(), ids=[n for n, _ in _commands()])
def test_every_command_teaches(name, command):
    """Every option has help text; every command's help has worked examples that name the command."""
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("help",):
            assert param.help and len(param.help) > 10, f"{name} {param.opts} has no help text"
    result = invoke(name, "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output and "offload-launch" in result.output.split("Examples:")[1]


def test_version_and_shell_completion(tmp_path):
    import os
    import subprocess
    import sys

    from launcher import __version__

    assert invoke("--version").output.strip() == f"offload-launch, version {__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "offload-launch")
    env = dict(os.environ, _OFFLOAD_LAUNCH_COMPLETE="bash_source")
    completion = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert completion.returncode == 0 and "_offload_launch_completion" in completion.stdout
    env = dict(
        os.environ, _OFFLOAD_LAUNCH_COMPLETE="bash_complete", COMP_WORDS="offload-launch --zero-st", COMP_CWORD="1"
    )
    words = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60).stdout
    assert "--zero-stage" in words


def test_training_dry_run_names_the_run_folder_as_typed(tmp_path, monkeypatch):
    """The folder in the messages is the one the user typed (relative stays relative); the ranks get it absolute."""
    monkeypatch.chdir(tmp_path)
    demo = REPO / "launcher" / "demo"
    args = ["--model", str(demo / "tiny-llama"), "--data", str(demo / "data" / "train.jsonl"), "--dry-run"]
    result = CliRunner().invoke(cli, [*args, "--output-dir", "out", "--host-spec", "cpu-only", "--seq-len", "64"])
    assert result.exit_code == 0, result.output
    assert "would write out/plan.json, ds_config.json, run_spec.json, start at step 1 and run:" in result.output
    assert f"--run-spec {tmp_path / 'out' / 'run_spec.json'}" in result.output
    assert list(tmp_path.iterdir()) == []
