"""Several machines (launcher/job/nodes.py and the launch it shapes): the hostfile's hosts, the ssh check made
the way pdsh reaches each host (for real, against a port nobody listens on), the environment file every node's
ranks read, and the rendezvous on the hostfile's first host."""

from __future__ import annotations

import socket

import pytest

from launcher import settings
from launcher.errors import UserInputError
from launcher.job import launch, nodes, prepare
from launcher.job.planning import build_plan, hostfile_hosts
from tests.helpers import REPO, host_path

DEMO = REPO / "launcher" / "demo"


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])  # free once the socket closes: nobody listens there


def test_hostfile_hosts_in_order_without_comments(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode-a slots=8\n\n  # spare\nnode-b slots=8\n")
    assert hostfile_hosts(str(path)) == ["node-a", "node-b"]
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(UserInputError, match="lists no hosts"):
        hostfile_hosts(str(tmp_path / "empty"))


def test_ssh_is_called_as_pdsh_calls_it():
    assert nodes.ssh_port(("--ssh_port", "2222")) == "2222" and nodes.ssh_port(("--ssh_port=22",)) == "22"
    assert nodes.ssh_port(("--include", "a:0")) is None
    command = nodes.ssh_command("node-a", "2222", {"PDSH_SSH_ARGS_APPEND": "-i /k -o LogLevel=ERROR"})
    assert command == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-i", "/k", "-o", "LogLevel=ERROR",
        "-p", "2222", "node-a", "true",
    ]  # fmt: skip


def test_a_host_that_refuses_ssh_is_one_line_naming_it(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=1\n")
    with pytest.raises(UserInputError) as err:
        nodes.check_ssh(str(hosts), ("--ssh_port", closed_port()), environ={})
    message = str(err.value)
    assert message.startswith(f"host 127.0.0.1 of --hostfile {hosts} does not answer ssh (")
    assert "Connection refused" in message and "\n" not in message


def test_every_node_gets_the_launch_environment_and_the_first_host_is_the_rendezvous(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a slots=1\nnode-b slots=1\n")
    typed = {
        "model": str(DEMO / "tiny-llama"),
        "data": str(DEMO / "data" / "train.jsonl"),
        "host_spec": host_path("cpu-only"),
        "hostfile": str(hosts),
        "output_dir": str(tmp_path / "out"),
    }
    s = settings.layer(typed)
    job = prepare.prepare(build_plan(s), s, output_dir=tmp_path / "out", tokenize=False)
    argv = " ".join(job.argv)
    assert "--master_addr node-a" in argv and "--no_ssh_check" in argv
    assert job.env["DS_ENV_FILE"] == str((tmp_path / "out" / nodes.ENV_FILE).resolve())
    prepare.write(job)
    written = (tmp_path / "out" / nodes.ENV_FILE).read_text().splitlines()
    assert [f"{k}={v}" for k, v in job.env.items() if k != "DS_ENV_FILE"] == [
        line for line in written if not line.startswith(nodes.FORWARDED_PREFIXES)
    ]
    assert "DS_ACCELERATOR=cpu" in written and any(line.startswith("OMP_NUM_THREADS=") for line in written)
    typed_addr = settings.layer({**typed, "master_addr": "10.0.0.1"})
    argv, _ = launch.build_command(prepare.launch_spec(build_plan(typed_addr), typed_addr, tmp_path, ()))
    assert "--master_addr 10.0.0.1" in " ".join(argv)


def test_one_node_has_no_environment_file():
    spec = launch.LaunchSpec("r.json", 1, "cpu", 2, 1234)
    argv, env = launch.build_command(spec)
    assert "DS_ENV_FILE" not in env and "--no_ssh_check" not in argv


def test_the_tools_and_the_hubs_variables_reach_every_node_but_no_secret():
    environ = {
        "OFFLOAD_LAUNCH_KILL_AT": "step:3",
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": "hf_secret",
        "TRANSFORMERS_CACHE": "/cache",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HF_HOME": "/a\nb",
        "OMP_NUM_THREADS": "64",
    }
    got = nodes.ranks_environment({"OMP_NUM_THREADS": "2", "DS_ENV_FILE": "/out/deepspeed_env"}, environ)
    assert got == {
        "OFFLOAD_LAUNCH_KILL_AT": "step:3",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_CACHE": "/cache",
        "OMP_NUM_THREADS": "2",  # the launch's, not this shell's
    }
