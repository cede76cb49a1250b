"""Several machines (--hostfile): the hosts a DeepSpeed hostfile names, whether each one answers ssh the way
DeepSpeed's pdsh runner will reach it, and the environment file that gives every node's ranks the same
variables.

DeepSpeed's runner (deepspeed/launcher/runner.py main()) starts the other nodes through pdsh over ssh and
forwards to them only the variables whose names start with EXPORT_ENVS' prefixes (MLFLOW, PYTHON, MV2, UCX) and
the accelerator's export_envs(), plus every `KEY=VALUE` line of the file DS_ENV_FILE names (default
`.deepspeed_env` in ~ or the working folder). What the launch sets for the ranks (OMP_NUM_THREADS, the
accelerator, the tokenizer's threads) would otherwise reach the launching node's ranks only: each remote rank's
torch and CPU-Adam would run on every core of its node.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from launcher.errors import UserInputError
from launcher.job.planning import hostfile_hosts

ENV_FILE = "deepspeed_env"  # OUT/deepspeed_env: the ranks' variables, for DS_ENV_FILE
# This machine's variables every node's ranks need as well: the tool's own (fault drills), the Hugging Face hub's
# and transformers' (offline mode, cache folders). Secrets stay out of the file in the run folder: a name with
# TOKEN, SECRET, PASSWORD or KEY in it is not written (log the other nodes in themselves).
FORWARDED_PREFIXES = ("OFFLOAD_LAUNCH_", "HF_", "TRANSFORMERS_")
SECRET_MARKS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
SSH_TIMEOUT_SECONDS = 10


def ssh_port(launcher_args: tuple[str, ...]) -> str | None:
    """The runner's `--ssh_port N` (or `--ssh_port=N`) among the arguments after `--`."""
    for i, arg in enumerate(launcher_args):
        if arg == "--ssh_port" and i + 1 < len(launcher_args):
            return launcher_args[i + 1]
        if arg.startswith("--ssh_port="):
            return arg.split("=", 1)[1]
    return None


def ssh_command(host: str, port: str | None, environ: Mapping[str, str]) -> list[str]:
    """How pdsh reaches `host` (PDSH_RCMD_TYPE=ssh: `ssh [PDSH_SSH_ARGS_APPEND] [-p PORT] host`), asked to run
    `true` without a password prompt."""
    extra = shlex.split(environ.get("PDSH_SSH_ARGS_APPEND", ""))
    port_args = ["-p", port] if port else []
    options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_SECONDS}"]
    return ["ssh", *options, *extra, *port_args, host, "true"]


def check_ssh(hostfile: str, launcher_args: tuple[str, ...], environ: Mapping[str, str] | None = None) -> None:
    """Every host answers ssh as pdsh will call it (one line naming the first that does not, and why). DeepSpeed's
    own check tries the first host only, without PDSH_SSH_ARGS_APPEND, and stops with a traceback."""
    environ = os.environ if environ is None else environ
    port = ssh_port(launcher_args)
    for host in hostfile_hosts(hostfile):
        command = ssh_command(host, port, environ)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=SSH_TIMEOUT_SECONDS + 5)
        except FileNotFoundError:
            raise UserInputError("--hostfile runs ssh to reach the other hosts, and ssh is not installed") from None
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(command, 255, "", "no answer within the timeout")
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
            raise UserInputError(
                f"host {host} of --hostfile {hostfile} does not answer ssh ({why}); `{shlex.join(command)}` must "
                "work without a password (PDSH_SSH_ARGS_APPEND adds ssh options, `-- --ssh_port N` a port)"
            )


def ranks_environment(env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """What every node's ranks get: the launch's env (but DS_ENV_FILE itself) and this machine's FORWARDED_PREFIXES
    variables that hold no secret and no line break (the file has one variable per line)."""
    forwarded = {
        key: value
        for key, value in environ.items()
        if key.startswith(FORWARDED_PREFIXES) and not any(mark in key for mark in SECRET_MARKS) and "\n" not in value
    }
    return {**forwarded, **{key: value for key, value in env.items() if key != "DS_ENV_FILE"}}


def write_env_file(path: Path, env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> None:
    """OUT/deepspeed_env: ranks_environment, one KEY=VALUE per line, as the runner reads it (`key, val =
    var.split('=', maxsplit=1)`)."""
    variables = ranks_environment(env, os.environ if environ is None else environ)
    path.write_text("".join(f"{key}={value}\n" for key, value in variables.items()))
