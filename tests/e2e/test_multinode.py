"""Two nodes for real, on this machine: a throwaway sshd on a loopback port with a key made here, a hostfile
naming two hosts that both reach this machine (`localhost` and `127.0.0.1`), and `offload-launch --hostfile
... --launcher pdsh`, so that DeepSpeed's runner starts one node's ranks per host over ssh (pdsh), which join
one gloo group on the CPU accelerator. The run plans for 2 nodes, trains, checkpoints, is killed mid-run, resumes
with the same command, and exports; every rank on both nodes gets the launch's environment (DS_ENV_FILE).

Needs root (sshd) and Debian's openssh-server and pdsh (`make install` installs them as root); skipped with one
line otherwise."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.drills import KILL_AT_ENV
from launcher.job import rundir
from tests.e2e.conftest import REPO, cpu_environ, launch, launch_args, read_metrics, run_launch

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An sshd on 127.0.0.1 that lets root in with a key made here; PDSH_SSH_ARGS_APPEND tells ssh (pdsh's, and
    the tool's check) to use it. Stopped at the end of the module."""
    if os.geteuid() != 0:
        pytest.skip("the two-node test starts sshd, which needs root")
    if not (Path(SSHD).exists() and shutil.which("pdsh") and shutil.which("ssh-keygen")):
        pytest.skip("the two-node test needs openssh-server and pdsh (make install installs them as root)")
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    port = free_port()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {folder / 'sshd.pid'}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no sshd"
        time.sleep(0.1)
    ssh_args = f"-i {folder / 'user_key'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    yield SimpleNamespace(port=port, env={"PDSH_SSH_ARGS_APPEND": ssh_args})
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def hostfile(tmp_path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    return path


ARGS = ("--steps", "4", "--save-every", "2", "--zero-stage", "2", "--offload-optimizer", "cpu", "--no-bind-cores")


def two_nodes(sshd, hostfile, *extra) -> tuple[str, ...]:
    return ("--hostfile", str(hostfile), "--launcher", "pdsh", *ARGS, *extra, "--", "--ssh_port", str(sshd.port))


def test_two_nodes_train_checkpoint_resume_after_a_kill_and_export(tiny_model, tiny_data, tmp_path, sshd, hostfile):
    out = tmp_path / "run"
    plan = json.loads(launch(tiny_model, tiny_data, out, *two_nodes(sshd, hostfile, "--dry-run", "--json")).stdout)
    assert plan["workload"]["nodes"] == 2 and plan["workload"]["world_size"] == 2 * plan["workload"]["ranks_per_node"]

    killed = launch(tiny_model, tiny_data, out, *two_nodes(sshd, hostfile), env={**sshd.env, KILL_AT_ENV: "step:3"})
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert rundir.newest_checkpoint_step(out) == 2  # written by both nodes' ranks, then marked complete
    environment = (out / "deepspeed_env").read_text()
    assert "OMP_NUM_THREADS=" in environment and "DS_ACCELERATOR=cpu" in environment

    resumed = run_launch(tiny_model, tiny_data, out, *two_nodes(sshd, hostfile), env=sshd.env)
    assert "resumed from step2 (step 2)" in resumed.stderr
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]  # each step exactly once
    summary = json.loads((out / "run.json").read_text())
    ranks = summary["ranks"]
    assert summary["world_size"] == len(ranks) == plan["workload"]["world_size"]
    assert sorted({r["node_rank"] for r in ranks}) == [0, 1]  # one node's ranks per host
    threads = str(plan["workload"].get("threads_per_rank") or ranks[0]["omp_num_threads"])
    assert all(r["omp_num_threads"] == threads and r["accelerator"] == "cpu" for r in ranks), ranks
    assert all(r["torch_threads"] == int(r["omp_num_threads"]) for r in ranks), ranks
    assert (out / "final" / "config.json").exists()


def test_node_local_checkpoints_each_node_keeps_its_own_and_a_lost_one_is_refused_by_name(
    tiny_model, tiny_data, tmp_path, sshd, hostfile
):
    """--node-local-checkpoints: each node writes its ranks' shards (and, DeepSpeed's use_node_local_storage, the
    model's states) into its own folder, marked complete once every rank on both nodes wrote; a resume loads the
    newest step every node has; a node whose folder is gone is named, and nothing starts."""
    out, local = tmp_path / "run", tmp_path / "local"
    args = two_nodes(sshd, hostfile, "--node-local-checkpoints", str(local))
    killed = launch(tiny_model, tiny_data, out, *args, env={**sshd.env, KILL_AT_ENV: "step:3"})
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert json.loads((out / "ds_config.json").read_text())["checkpoint"] == {"use_node_local_storage": True}
    assert not (out / "checkpoints").exists()
    root = Path(rundir.node_local_root(str(local), out))
    assert sorted(p.name for p in root.iterdir()) == ["node0", "node1"]
    for node in (0, 1):
        step2 = root / f"node{node}" / "step2"
        assert (step2 / rundir.COMPLETE_MARKER).exists() and (step2 / "mp_rank_00_model_states.pt").exists()
        shards = sorted(p.name for p in step2.glob("*zero_pp_rank_*"))
        assert shards and all(f"zero_pp_rank_{node}_" in name for name in shards), shards  # its own rank's only
    assert rundir.newest_checkpoint_step(out, str(root)) == 2

    resumed = run_launch(tiny_model, tiny_data, out, *args, env=sshd.env)
    assert "resumed from step2 (step 2)" in resumed.stderr
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]

    shutil.rmtree(root / "node1")  # node 1's disk replaced: its shards are gone
    more = two_nodes(sshd, hostfile, "--node-local-checkpoints", str(local), "--steps", "6")
    refused = launch(tiny_model, tiny_data, out, *more, env=sshd.env)
    assert refused.returncode != 0
    assert "cannot resume: node 1 (" in refused.stderr and "--no-resume to start over" in refused.stderr
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]  # nothing trained


def test_a_host_that_does_not_answer_ssh_is_one_line_before_anything_starts(tiny_model, tiny_data, tmp_path, sshd):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    proc = launch(tiny_model, tiny_data, tmp_path / "run", *two_nodes(sshd, hostfile), env=sshd.env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: host no-such-host.invalid of --hostfile ") and "does not answer ssh" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_killing_one_nodes_ranks_stops_the_run_in_bounded_time(tiny_model, tiny_data, tmp_path, sshd, hostfile):
    """A node dying mid-run (its ranks SIGKILLed, as a machine that loses power) stops the other node's ranks
    (gloo sees the connection close) and the command returns; the same command resumes from the last complete
    checkpoint."""
    out = tmp_path / "run"
    args = two_nodes(sshd, hostfile, "--steps", "40")
    env = dict(cpu_environ(os.environ), HF_HUB_OFFLINE="1", **sshd.env)
    proc = subprocess.Popen(
        launch_args(tiny_model, tiny_data, out, *args),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while rundir.newest_checkpoint_step(out) < 2:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.5)
    victims = rank_pids(out, node_rank=1)
    assert victims, "no rank of node 1 found"
    started = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    log, _ = proc.communicate(timeout=300)
    stopped = time.monotonic() - started
    print(f"the run stopped {stopped:.1f} s after node 1 was killed (exit {proc.returncode})")
    assert proc.returncode != 0 and stopped < 120, (stopped, log[-3000:])
    last_line = log.strip().splitlines()[-1]
    assert "killed on node 1 (127.0.0.1, hostname " in last_line, log[-2000:]
    assert "): rank 1 (started, never ended)" in last_line
    last = rundir.newest_checkpoint_step(out)
    run_launch(tiny_model, tiny_data, out, *two_nodes(sshd, hostfile, "--steps", str(last + 2)), env=sshd.env)
    assert [m["step"] for m in read_metrics(out)] == list(range(1, last + 3))


def rank_pids(out: Path, node_rank: int) -> list[int]:
    """The pids of the training ranks of `node_rank` (their environment names it: CROSS_RANK, set by DeepSpeed's
    launch.py) that train the run in `out`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        ours = b"launcher.rank" in cmdline and str(out).encode() in b" ".join(cmdline)
        if ours and environ.get(b"CROSS_RANK") == str(node_rank).encode():
            found.append(int(proc.name))
    return found
