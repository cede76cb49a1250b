"""Slurm: the batch script `--sbatch FILE` writes, and the entry point of the ranks `--launcher slurm` starts.

DeepSpeed's runner (deepspeed/launcher/multinode_runner.py, SlurmRunner.get_cmd) starts every rank of every node
as one Slurm task of a single `srun`:

    srun -n <ranks in all> [--launcher_args] [--nodes N] [--gpus-per-node <--num_gpus>] --export=ALL,...
         <python> -u <user_script> <user_args>

so it needs no ssh, but it does three things the per-node launcher (deepspeed/launcher/launch.py) does not:
it ignores `--module` (the user script is run as a file), it sets none of RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (DeepSpeed's init_distributed then looks for MPI through mpi4py), and it asks for
`--gpus-per-node` whenever `--num_gpus` is given, also on the CPU accelerator. This file is therefore also the
script srun runs (`main()`): it sets torch.distributed's variables from srun's (SLURM_PROCID, SLURM_LOCALID,
SLURM_STEP_NUM_TASKS, ...) and runs `launcher.rank`. launch.build_command points SlurmRunner at it.

The batch script (`script()`) asks Slurm for the plan's nodes, writes DeepSpeed's hostfile from the allocation
(`scontrol show hostnames`), names the first node as the rendezvous, and runs the offload-launch command the user
typed, rebuilt from the typed settings (`typed_options()`): deterministic, whatever shell or wrapper started this one.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserInputError
from launcher.settings import DECLARATIONS, Kind

RANK_SCRIPT = str(Path(__file__).resolve())  # what SlurmRunner's srun runs on every rank (`main()` below)
RANK_MODULE = "launcher.rank"  # launch.ENTRY_MODULE: the rank itself
# Settings the batch script sets itself (the allocation's hostfile and first node, the launcher) or that would stop
# the job from training (the script, a dry run): the rest of what the user typed is the job's command as typed.
REPLACED = ("sbatch", "dry_run", "hostfile", "launcher", "master_addr")
JOB_NAME_PREFIX = "offload-launch-"
HOSTS_SHELL_VARIABLE = "HOSTFILE"


def typed_options(typed: Mapping[str, object]) -> list[tuple[str, ...]]:
    """The typed settings (`typed_values()`: name -> value) as command-line options, one (flag[, value]) each, in
    the settings' declared order, without the REPLACED ones. A negatable flag keeps its side (--no-resume); the
    live host, which typed_values() reads as None, is `this` again (it overrides a recipe's host)."""
    from launcher.recipes import LIVE_HOST

    options = []
    for name, d in DECLARATIONS.items():
        if name not in typed or name in REPLACED:
            continue
        value = LIVE_HOST if typed[name] is None and d.kind is Kind.HOST else typed[name]
        if value is None:
            continue
        if d.type is not bool:
            options.append((d.flag, str(value)))
        elif d.negatable:
            options.append((d.flag if value else "--no-" + d.flag[2:],))
        elif value:
            options.append((d.flag,))
    return options


@dataclass(frozen=True)
class BatchJob:
    """What the batch script asks Slurm for, and the command it runs."""

    name: str  # the model's short name
    nodes: int
    ranks_per_node: int
    gpus: bool  # the ranks run on GPUs: one per rank is asked for (--gpus-per-node)
    cpu_cores: int  # per node, as the plan counts them
    launcher: str  # DeepSpeed's launcher on several nodes: "slurm" (srun), "pdsh", ...
    options: tuple[tuple[str, ...], ...]  # typed_options(): without the hostfile, launcher and rendezvous
    launcher_args: tuple[str, ...]  # what the user typed after `--`, for DeepSpeed's launcher
    workdir: str  # where the user ran it: the typed relative paths are relative to it
    about: str = ""  # one comment line: the plan
    python: str = sys.executable  # runs `-m launcher`

    @property
    def argv(self) -> list[str]:
        """The whole command the job runs: the typed one, then the allocation's hostfile, launcher and rendezvous
        (shell words for the variables the script sets), then `--` and what was typed after it."""
        argv = [self.python, "-m", "launcher", *(word for option in self.options for word in option)]
        argv += ["--hostfile", f"${HOSTS_SHELL_VARIABLE}", "--launcher", self.launcher, "--master-addr", "$MASTER_ADDR"]
        return argv + (["--", *self.launcher_args] if self.launcher_args else [])

    @property
    def tasks_per_node(self) -> int:
        """srun (the slurm launcher) starts each rank as a Slurm task, so the allocation holds one task per rank;
        pdsh and mpirun start the ranks themselves from one process per node."""
        return self.ranks_per_node if self.launcher == "slurm" else 1

    @property
    def cpus_per_task(self) -> int:
        """Each task's share of the node's cores: the ranks' OMP_NUM_THREADS share (launch.threads_per_rank) for
        srun's tasks, every core for the one task that starts them all."""
        return max(1, self.cpu_cores // self.tasks_per_node)


def job_name(model_name: str) -> str:
    """offload-launch-<the model's last path part>, in the characters a job name shows cleanly (squeue, %x)."""
    short = Path(model_name.rstrip("/")).name or "model"
    return JOB_NAME_PREFIX + re.sub(r"[^A-Za-z0-9._-]+", "-", short)


def batch_job(plan, typed: Mapping[str, object], launcher_args: tuple[str, ...] = (), *, workdir: str | None = None):
    """The job of a plan (nodes, ranks per node, accelerator, cores) and the typed command. The launcher is the
    typed --launcher, else slurm: inside an allocation srun reaches every node without ssh."""
    launcher = str(typed["launcher"]) if typed.get("launcher") else "slurm"
    strategy = plan.chosen.strategy.label if plan.chosen is not None else "no strategy fits"
    host = "this machine" if plan.host.source == "live" else plan.host.source
    about = (
        f"{plan.model.name}: {strategy}, {plan.host.nodes} node(s) x {plan.ranks_per_node} rank(s) "
        f"(world {plan.world_size}), planned for {host}"
    )
    return BatchJob(
        name=job_name(plan.model.name),
        nodes=plan.host.nodes,
        ranks_per_node=plan.ranks_per_node,
        gpus=plan.host.accelerator == "cuda",
        cpu_cores=plan.host.cpu_cores,
        launcher=launcher,
        options=tuple(typed_options(typed)),
        launcher_args=tuple(launcher_args),
        workdir=workdir or os.getcwd(),
        about=about,
    )


def hostfile_lines(ranks_per_node: int) -> str:
    """The shell pipeline that writes DeepSpeed's hostfile from the allocation: one `HOST slots=R` per node, in
    Slurm's order (the batch script runs on the first)."""
    return f"scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/ slots={ranks_per_node}/'"


def script(job: BatchJob) -> str:
    """The sbatch script: #SBATCH lines (the #SBATCH options must come before the first command), the hostfile
    from the allocation, the rendezvous on its first node, then the typed command with them."""
    var = HOSTS_SHELL_VARIABLE
    sbatch = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        f"--ntasks-per-node={job.tasks_per_node}",
        *([f"--gpus-per-node={job.ranks_per_node}"] if job.gpus else []),
        f"--cpus-per-task={job.cpus_per_task}",
        "--mem=0",  # all of each node's memory: the plan budgets the node's RAM for the offloaded states
        "--exclusive",  # and all of its cores and GPUs
        "--output=%x-%j.out",
    ]
    head = [
        "#!/bin/bash",
        f"# {job.about}" if job.about else "# offload-launch training job",
        "# Submit with `sbatch FILE`. Written by offload-launch --sbatch: edit the #SBATCH lines as you need.",
        *(f"#SBATCH {option}" for option in sbatch),
        "##SBATCH --time=1-00:00:00",
        "##SBATCH --partition=NAME",
        "##SBATCH --account=NAME",
    ]
    lines = [
        shlex.join([job.python, "-m", "launcher"]),
        *map(shlex.join, job.options),
        f'--hostfile "${var}"',
        f"--launcher {shlex.quote(job.launcher)}",
        '--master-addr "$MASTER_ADDR"',
    ]
    if job.launcher_args:
        lines.append(shlex.join(["--", *job.launcher_args]))
    body = [
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(job.workdir)}",
        "",
        f"# DeepSpeed's hostfile: the allocation's nodes, {job.ranks_per_node} rank(s) each. Only this node reads it",
        "# (offload-launch's plan and DeepSpeed's runner), so it stays out of the shared run folder.",
        f'{var}="$(mktemp "${{TMPDIR:-/tmp}}/offload-launch-hosts-${{SLURM_JOB_ID}}.XXXXXX")"',
        f'{hostfile_lines(job.ranks_per_node)} > "${var}"',
        "# The rendezvous: rank 0 runs on the allocation's first node, this one.",
        f'MASTER_ADDR="$(head -n 1 "${var}" | cut -d " " -f 1)"',
        "# srun (DeepSpeed's slurm launcher) does not take --cpus-per-task from the #SBATCH lines (Slurm >= 22.05).",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
        f'echo "offload-launch: nodes $(cut -d " " -f 1 "${var}" | paste -sd " "), rendezvous $MASTER_ADDR"',
        "",
        "status=0",
        " \\\n    ".join(lines) + " || status=$?",
        f'rm -f "${var}"',
        'exit "$status"',
    ]
    return "\n".join(head + body) + "\n"


def write(path: str, job: BatchJob) -> Path:
    """Write the script to `path`; one line when it cannot be written."""
    target = Path(path)
    try:
        target.write_text(script(job))
    except OSError as exc:
        raise UserInputError(
            f"--sbatch {path}: cannot write it ({exc.strerror}); pass a file in a folder you own"
        ) from None
    return target


# ------------------------------------------------------------------------------------------ the ranks srun starts


def rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed's variables for a rank srun started, as deepspeed/launcher/launch.py sets them for the
    ranks it starts (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE), from srun's per-task ones.
    Nothing when RANK is set: DeepSpeed's runner takes its one-node path (launch.py) for a single host, also with
    --launcher slurm, and that launcher has set them. MASTER_ADDR and MASTER_PORT come from the launch's
    environment (srun's --export=ALL passes the runner's on); LOCAL_SIZE assumes as many ranks on every node,
    which SlurmRunner.validate_active_resources enforces."""
    if "RANK" in environ:
        return {}
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT") if name not in environ]
    if missing:
        raise UserInputError(
            f"{RANK_SCRIPT} runs a rank that srun started (DeepSpeed's --launcher slurm); {', '.join(missing)} "
            "not set: start it through offload-launch --launcher slurm"
        )
    world = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
    return {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "WORLD_SIZE": str(world),
        "LOCAL_SIZE": str(max(1, world // nodes)),
        "CROSS_RANK": environ.get("SLURM_NODEID", "0"),
        "CROSS_SIZE": str(nodes),
    }


def main() -> None:
    """`python -u launcher/job/sbatch.py --run-spec OUT/run_spec.json`: one rank, under srun. Run as a file, its
    folder is first on sys.path: dropped, so that launcher/job's modules never shadow a top-level one."""
    import runpy

    if sys.path and Path(sys.path[0] or ".").resolve() == Path(RANK_SCRIPT).parent:
        sys.path.pop(0)
    try:
        os.environ.update(rank_environment(os.environ))
    except UserInputError as err:
        raise SystemExit(f"[offload-launch] {err}") from None  # one line, as launcher.rank's own refusals
    runpy.run_module(RANK_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
