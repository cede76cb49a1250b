"""--sbatch FILE: the batch script's contents for the plans it is written from, that bash reads it and runs it
with the allocation's hosts (scontrol stubbed), that writing it starts nothing; and the entry point of the ranks
DeepSpeed's slurm launcher starts. A real Slurm runs these scripts in tests/e2e/test_slurm.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.cli.options import typed_values
from launcher.errors import UserInputError
from launcher.job import sbatch
from tests.helpers import host_path

HOSTS_LINE = '--hostfile "$HOSTFILE" --launcher slurm --master-addr "$MASTER_ADDR"'


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def job_command(text: str) -> list[str]:
    """The words of the command the script runs (its continuation lines joined), as bash will split them."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if " -m launcher" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].endswith(" || status=$?"))
    joined = " ".join(line.rstrip("\\").strip() for line in lines[start : end + 1])
    return shlex.split(joined.removesuffix(" || status=$?"))


def bash_accepts(path: Path) -> None:
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def write_script(tmp_path: Path, model: Path, *args: str, data: Path | None = None, script: Path | None = None):
    """offload-launch --model M --data D --output-dir OUT --sbatch FILE ARGS through the real CLI, in tmp_path."""
    if data is None:
        data = tmp_path / "d.jsonl"
        data.write_text('{"text": "hello world"}\n')
    script = script or tmp_path / "job.sh"
    typed = ["--model", str(model), "--data", str(data), "--output-dir", str(tmp_path / "out"), "--sbatch", str(script)]
    result = CliRunner().invoke(cli, [*typed, *args])
    return result, script


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script's `cd` is the folder the command ran in


def test_one_node_cpu_script(tmp_path, tiny_llama_dir):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    result, script = write_script(tmp_path, tiny_llama_dir, "--host-spec", "cpu-only", "--steps", "2", data=data)
    assert result.exit_code == 0, result.output
    assert f"wrote {script}: 1 node(s) x 1 rank(s), launcher slurm; submit it with `sbatch {script}`" in result.output
    assert not (tmp_path / "out").exists()  # planned and checked as a dry run: nothing written but the script
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert sbatch_lines(text) == [
        "#SBATCH --job-name=offload-launch-tiny-llama",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",  # cpu-only.yaml: 2 cores, one rank
        "#SBATCH --mem=0",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
    ]
    assert "--gpus-per-node" not in text  # the CPU accelerator asks Slurm for no GPU
    assert f"cd {tmp_path}\n" in text
    assert "sed 's/$/ slots=1/'" in text
    assert job_command(text) == [
        sys.executable,
        "-m",
        "launcher",
        "--model",
        str(tiny_llama_dir),
        "--host-spec",
        host_path("cpu-only"),  # a described host's name, as typed_values() resolved it
        "--steps",
        "2",
        "--data",
        str(data),
        "--output-dir",
        str(tmp_path / "out"),
        *shlex.split(HOSTS_LINE),
    ]
    bash_accepts(script)


def test_two_node_gpu_script_from_a_described_host_and_a_hostfile(tmp_path, tiny_llama_dir):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node-a slots=8\nnode-b slots=8\n")
    result, script = write_script(
        tmp_path,
        tiny_llama_dir,
        *("--host-spec", host_path("8x-a100-80g"), "--hostfile", str(hosts), "--master-addr", "node-a"),
        *("--", "--force_multi"),
    )
    assert result.exit_code == 0, result.output
    assert "world 16" in result.output  # 2 nodes x 8 GPUs: the hostfile's host count
    text = script.read_text()
    assert sbatch_lines(text)[1:5] == [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",  # srun starts every rank as a task
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=16",  # 128 cores / 8 ranks: each rank's OMP_NUM_THREADS share
    ]
    assert "sed 's/$/ slots=8/'" in text
    words = job_command(text)
    # the allocation's hostfile and first node replace the typed ones; what followed `--` still does
    assert str(hosts) not in words and "node-a" not in words
    assert words[-8:] == [*shlex.split(HOSTS_LINE), "--", "--force_multi"]
    bash_accepts(script)


def test_a_typed_launcher_is_kept_with_one_task_per_node(tmp_path, tiny_llama_dir, write_host):
    two_nodes = write_host(Path(host_path("8x-a100-80g")).read_text() + "nodes: 2\n")
    result, script = write_script(tmp_path, tiny_llama_dir, "--host-spec", two_nodes, "--launcher", "pdsh")
    assert result.exit_code == 0, result.output
    text = script.read_text()
    assert sbatch_lines(text)[1:5] == [
        "#SBATCH --nodes=2",  # the described host's nodes: 2
        "#SBATCH --ntasks-per-node=1",  # pdsh starts each node's ranks from one process
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=128",
    ]
    assert job_command(text)[-6:] == ["--hostfile", "$HOSTFILE", "--launcher", "pdsh", "--master-addr", "$MASTER_ADDR"]


def test_paths_with_spaces_are_quoted(tmp_path, tiny_llama_dir, monkeypatch):
    model = shutil.copytree(tiny_llama_dir, tmp_path / "my models" / "tiny llama")
    data = tmp_path / "my data" / "d 1.jsonl"
    data.parent.mkdir()
    data.write_text('{"it\'s": "hello world"}\n')
    work = tmp_path / "work dir"
    work.mkdir()
    monkeypatch.chdir(work)
    script = tmp_path / "scripts dir" / "job 1.sh"
    script.parent.mkdir()
    result, _ = write_script(
        tmp_path, model, "--host-spec", "cpu-only", "--text-field", "it's", data=data, script=script
    )
    assert result.exit_code == 0, result.output
    text = script.read_text()
    assert f"cd '{work}'\n" in text
    assert "#SBATCH --job-name=offload-launch-tiny-llama" in text  # the space made shell- and squeue-safe
    words = job_command(text)
    assert words[3:5] == ["--model", str(model)]
    assert words[words.index("--text-field") + 1] == "it's"
    assert words[words.index("--data") + 1] == str(data)
    bash_accepts(script)


def test_the_script_runs_on_the_allocation_s_hosts(tmp_path):
    """The script itself, run by bash as sbatch would on the first node: scontrol (a stub on PATH) names two nodes,
    the hostfile has them with the ranks per node, the first is the rendezvous, the command gets both and the
    arguments with spaces intact, srun gets the task's cores, the exit status is the command's, and the hostfile
    is removed after it."""
    stubs = tmp_path / "stub bin"
    stubs.mkdir()
    scontrol = stubs / "scontrol"
    scontrol.write_text(
        '#!/bin/bash\n[ "$1 $2 $3" = "show hostnames node-[a-b]" ] || { echo "unexpected: $*" >&2; exit 9; }\n'
        "printf 'node-a\\nnode-b\\n'\n"
    )
    record = tmp_path / "record"
    command = stubs / "python 3"  # stands for the interpreter: writes what it was given, and the hostfile's text
    command.write_text(
        "#!/bin/bash\n"
        f'out={shlex.quote(str(record))}\nprintf "%s\\n" "$@" > "$out.args"\n'
        'while [ "$1" != --hostfile ]; do shift; done\n'
        'printf "%s" "$2" > "$out.path"; cat "$2" > "$out.hosts"\n'
        'printf "%s\\n" "$PWD" "$SRUN_CPUS_PER_TASK" > "$out.env"\nexit 7\n'
    )
    for stub in (scontrol, command):
        stub.chmod(0o755)
    work = tmp_path / "work dir"
    work.mkdir()
    temp = tmp_path / "job tmp"
    temp.mkdir()
    job = sbatch.BatchJob(
        name="offload-launch-x",
        nodes=2,
        ranks_per_node=4,
        gpus=True,
        cpu_cores=32,
        launcher="slurm",
        options=(("--data", "/my data/d.jsonl"), ("--no-resume",)),
        launcher_args=("--launcher_args", "--mpi=none --x"),
        workdir=str(work),
        python=str(command),
    )
    path = tmp_path / "job.sh"
    path.write_text(sbatch.script(job))
    environ = dict(
        os.environ,
        PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_NODELIST="node-[a-b]",
        SLURM_JOB_ID="42",
        SLURM_CPUS_PER_TASK="8",
        TMPDIR=str(temp),
    )
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=environ, cwd=tmp_path)
    assert done.returncode == 7, done.stderr  # the command's exit status is the job's
    assert "offload-launch: nodes node-a node-b, rendezvous node-a" in done.stdout
    hostfile = Path(Path(f"{record}.path").read_text())
    assert Path(f"{record}.hosts").read_text() == "node-a slots=4\nnode-b slots=4\n"
    assert hostfile.parent == temp and hostfile.name.startswith("offload-launch-hosts-42.")
    assert not hostfile.exists()  # removed once the command returned
    args = Path(f"{record}.args").read_text().splitlines()
    assert args == [
        *("-m", "launcher", "--data", "/my data/d.jsonl", "--no-resume"),
        *("--hostfile", str(hostfile), "--launcher", "slurm", "--master-addr", "node-a"),
        *("--", "--launcher_args", "--mpi=none --x"),
    ]
    expanded = {"$HOSTFILE": str(hostfile), "$MASTER_ADDR": "node-a"}
    assert args == [expanded.get(word, word) for word in job.argv[1:]]  # BatchJob.argv is the same command
    assert Path(f"{record}.env").read_text().splitlines() == [str(work), "8"]


def test_writing_the_script_starts_nothing(tmp_path, tiny_llama_dir, monkeypatch):
    from launcher.job import launch, train

    started = []
    real_popen = subprocess.Popen

    def popen(args, *a, **kw):
        started.append(list(args) if not isinstance(args, str) else [args])
        return real_popen(args, *a, **kw)

    def no_launch(*_a, **_kw):
        raise AssertionError("--sbatch launched the training")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(launch, "run", no_launch)
    monkeypatch.setattr(train, "launch_run", no_launch)
    result, script = write_script(tmp_path, tiny_llama_dir, "--host-spec", "cpu-only", "--dry-run")
    assert result.exit_code == 0, result.output
    assert script.is_file() and "--dry-run" not in job_command(script.read_text())
    assert not any("deepspeed.launcher.runner" in " ".join(map(str, argv)) for argv in started), started
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--smoke",), "--sbatch writes a training job and --smoke runs here; drop one"),
        (("--sbatch", "missing dir/job.sh"), "--sbatch missing dir/job.sh: cannot write it (No such file or dir"),
    ],
)
def test_refused_in_one_line(tmp_path, tiny_llama_dir, args, message):
    result, _ = write_script(tmp_path, tiny_llama_dir, "--host-spec", "cpu-only", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_without_data_there_is_no_job(tiny_llama_dir, tmp_path):
    result = CliRunner().invoke(cli, ["--model", str(tiny_llama_dir), "--sbatch", "job.sh"])
    assert result.exit_code == 2 and "--sbatch writes a training job: add --data PATH" in result.output
    assert not (tmp_path / "job.sh").exists()


def test_no_script_for_a_plan_that_does_not_fit(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    result, script = write_script(tmp_path, "meta-llama/Llama-2-70b-hf", "--host-spec", "cpu-only", data=data)
    assert result.exit_code == 3, result.output
    assert not script.exists()


def test_typed_options_round_trip_through_the_command_line():
    """The options rebuilt from what was typed are read back by `run` as the same typed values, but for the ones
    the batch script sets itself."""
    typed = {
        "model": "m",
        "host_spec": host_path("8x-a100-80g"),
        "lr": 0.005,
        "resume": False,
        "bind_cores": True,
        "json": True,
        "text_field": "body text",
        "dry_run": True,
        "hostfile": "h",
        "launcher": "pdsh",
        "master_addr": "a",
        "sbatch": "f",
    }
    options = sbatch.typed_options(typed)
    assert options == [
        ("--model", "m"),
        ("--host-spec", host_path("8x-a100-80g")),
        ("--lr", "0.005"),
        ("--text-field", "body text"),
        ("--no-resume",),
        ("--bind-cores",),
        ("--json",),
    ]
    run = cli.commands["run"]
    ctx = run.make_context("run", [word for option in options for word in option])
    kept = {name: value for name, value in typed.items() if name not in sbatch.REPLACED}
    assert typed_values(ctx, ctx.params) == kept
    assert sbatch.typed_options({"host_spec": None}) == [("--host-spec", "this")]  # the live host, over a recipe's


def test_job_name_is_the_model_s_short_name():
    assert sbatch.job_name("meta-llama/Llama-2-7b") == "offload-launch-Llama-2-7b"
    assert sbatch.job_name("./runs/my model (v2)/") == "offload-launch-my-model-v2-"


# ------------------------------------------------------------------------------------------ the ranks srun starts

SRUN_TASK = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NTASKS": "99",  # the job's, when the step's is there it wins
    "MASTER_ADDR": "node-a",
    "MASTER_PORT": "29500",
}


def test_rank_environment_from_srun():
    assert sbatch.rank_environment(SRUN_TASK) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_SIZE": "4",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
    }
    # DeepSpeed's runner took its one-node path: its launch.py has set them
    assert sbatch.rank_environment({**SRUN_TASK, "RANK": "0"}) == {}
    with pytest.raises(UserInputError, match="MASTER_PORT not set"):
        sbatch.rank_environment({k: v for k, v in SRUN_TASK.items() if k != "MASTER_PORT"})


def test_the_rank_script_sets_the_variables_and_runs_launcher_rank(monkeypatch):
    import runpy

    ran = {}

    def run_module(name, run_name, alter_sys):
        ran.update(name=name, run_name=run_name, rank=os.environ["RANK"], world=os.environ["WORLD_SIZE"])

    monkeypatch.setattr(runpy, "run_module", run_module)
    monkeypatch.setattr(os, "environ", dict(SRUN_TASK))  # main() sets the rank's variables in it
    sbatch.main()
    assert ran == {"name": "launcher.rank", "run_name": "__main__", "rank": "5", "world": "8"}


def test_the_rank_script_runs_as_a_file(tmp_path):
    """As SlurmRunner runs it: `python -u <file> --run-spec ...`, no -m. It reaches launcher.rank's main, which
    reads the run spec (missing here); without srun's variables it stops first, with one line."""
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    spec = str(tmp_path / "run_spec.json")
    as_srun = subprocess.run(
        [sys.executable, "-u", sbatch.RANK_SCRIPT, "--run-spec", spec],
        capture_output=True,
        text=True,
        env={**environ, **SRUN_TASK},
        cwd=tmp_path,
    )
    assert as_srun.returncode != 0 and spec in as_srun.stderr and "SLURM_PROCID" not in as_srun.stderr
    alone = subprocess.run(
        [sys.executable, "-u", sbatch.RANK_SCRIPT, "--run-spec", spec],
        capture_output=True,
        text=True,
        env={k: v for k, v in environ.items() if not k.startswith(("SLURM_", "MASTER_"))},
        cwd=tmp_path,
    )
    assert alone.returncode == 1 and alone.stderr.count("\n") == 1, alone.stderr
    assert "SLURM_PROCID, SLURM_LOCALID, MASTER_ADDR, MASTER_PORT not set" in alone.stderr
