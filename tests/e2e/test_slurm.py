"""A real one-node Slurm cluster (Debian's slurmctld, slurmd, slurm-client and munge, started here as root in a
temporary folder, on free ports, torn down after): the script `--sbatch` writes is submitted with `sbatch --wait`
and trains the bundled tiny Llama on the CPU accelerator, once through DeepSpeed's one-node launcher and once
through its slurm launcher (srun, forced onto the one node with --force_multi)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import LAUNCH_TIMEOUT_SECONDS, REPO, cpu_environ

pytestmark = pytest.mark.e2e

DEMO_MODEL = REPO / "launcher" / "demo" / "tiny-llama"
DEMO_DATA = REPO / "launcher" / "demo" / "data" / "train.jsonl"
TRAIN = ("--steps", "2", "--seq-len", "64", "--micro-batch", "2")
DAEMONS = ("munged", "slurmctld", "slurmd")
PROGRAMS = (*DAEMONS, "sbatch", "srun", "sinfo", "scontrol")
READY_SECONDS = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _stop(pid_file: Path) -> None:
    """Stop the daemon this test started (its pid file's process), and wait until it is gone."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """SLURM_CONF of a one-node cluster of this machine, ready for jobs."""
    if os.geteuid() != 0:
        pytest.skip("a private Slurm cluster needs root (slurmd runs the jobs)")
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: apt-get install slurmctld slurmd slurm-client munge")
    node = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(node)
    except OSError:
        pytest.skip(f"this machine's name {node} does not resolve: it is the job's rendezvous")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool", "log"):
        (root / folder).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = root / "munge.sock"
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=offloadlaunchtest",
                f"SlurmctldHost={node}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                f"AuthInfo=socket={socket_path}",
                "CredType=cred/munge",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",  # no cgroups: runs in a container too
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SlurmdParameters=config_overrides",  # the CPUs below, whatever slurmd counts
                "ReturnToService=2",
                "MpiDefault=none",
                # every logical CPU: the plan counts physical cores, at most as many
                f"NodeName={node} CPUs={os.cpu_count()} State=UNKNOWN",
                "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    environ = dict(os.environ, SLURM_CONF=str(conf))
    started = []
    try:
        munged = [
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'log' / 'munged.log'}",
            f"--seed-file={root / 'munge.seed'}",
        ]
        for argv, pid_file in (
            (munged, root / "munged.pid"),
            (["slurmctld", "-f", str(conf)], root / "slurmctld.pid"),
            (["slurmd", "-f", str(conf)], root / "slurmd.pid"),
        ):
            subprocess.run(argv, check=True, env=environ, capture_output=True, timeout=60)
            started.append(pid_file)
        deadline = time.monotonic() + READY_SECONDS
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=environ, capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            time.sleep(1)
        else:
            logs = "".join(p.read_text()[-2000:] for p in sorted((root / "log").glob("*.log")))
            pytest.fail(f"the test's Slurm node is {state.strip() or 'not there'} after {READY_SECONDS} s\n{logs}")
        yield environ
    finally:
        for pid_file in reversed(started):
            _stop(pid_file)


def submit(slurm: dict, folder: Path, *extra: str) -> tuple[dict, str]:
    """offload-launch ... --sbatch job.sh in `folder`, then `sbatch --wait job.sh`: the run's run.json and the job's
    log."""
    environ = dict(cpu_environ(slurm), HF_HUB_OFFLINE="1")
    out = folder / "run"
    written = subprocess.run(
        [sys.executable, "-m", "launcher", "--model", str(DEMO_MODEL), "--data", str(DEMO_DATA), *TRAIN]
        + ["--output-dir", str(out), "--sbatch", "job.sh", *extra],
        capture_output=True,
        text=True,
        env=environ,
        cwd=folder,
        timeout=300,
    )
    assert written.returncode == 0, written.stdout[-2000:] + written.stderr[-3000:]
    assert not out.exists()  # writing the script starts nothing
    job = subprocess.run(
        ["sbatch", "--wait", "--parsable", "job.sh"],
        capture_output=True,
        text=True,
        env=environ,
        cwd=folder,
        timeout=LAUNCH_TIMEOUT_SECONDS,
    )
    job_id = job.stdout.strip().split(";")[0]
    logs = list(folder.glob(f"offload-launch-tiny-llama-{job_id}.out"))
    log = logs[0].read_text() if logs else ""
    assert job.returncode == 0, f"sbatch exited {job.returncode}: {job.stderr}\n{log[-6000:]}"
    return json.loads((out / "run.json").read_text()), log


def test_the_batch_script_trains_on_the_allocation(slurm, tmp_path):
    run, log = submit(slurm, tmp_path)
    node = socket.gethostname().split(".")[0]
    assert f"offload-launch: nodes {node}, rendezvous {node}" in log
    assert "--launcher slurm" in log and f"--master_addr {node}" in log
    assert run["steps"] == 2 and run["world_size"] == 1
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_deepspeed_s_slurm_launcher_starts_the_ranks_with_srun(slurm, tmp_path):
    """Two ranks as two srun tasks (SlurmRunner), each with its torch.distributed variables from srun's."""
    run, log = submit(slurm, tmp_path, "--num-gpus", "2", "--", "--force_multi")
    assert "cmd = srun -n 2 " in log
    assert "--gpus-per-node" not in log  # the CPU accelerator asks srun for no GPU
    assert run["steps"] == 2 and run["world_size"] == 2
    if "ranks" in run:  # where each rank ran (rank/trainer.py rank_environments)
        assert sorted(rank["rank"] for rank in run["ranks"]) == [0, 1]
