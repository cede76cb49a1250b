"""Core binding: whether DeepSpeed pins each rank to its share of the cores (numactl, --bind_cores_to_rank), on
which cores (--bind_core_list within this process's affinity mask), and the one line that says why."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from launcher.errors import UserInputError
from launcher.plan.planner import Plan
from launcher.settings import Settings

NUMACTL_MISSING = "--bind-cores needs numactl (DeepSpeed binds ranks with it): apt-get install numactl"


@dataclass(frozen=True)
class CoreBinding:
    """Whether the ranks run under DeepSpeed's --bind_cores_to_rank, and the one line that tells the user why
    (None: nothing to say - they typed it, or nothing is offloaded)."""

    bind: bool
    note: str | None = None


def binds_here(settings: Settings) -> bool:
    """The ranks start on this machine: DeepSpeed's launch.py runs numactl here (with --hostfile it runs on
    each host, whose numactl this machine cannot see)."""
    return not settings.hostfile


def check_bind_cores(settings: Settings) -> None:
    """--bind-cores typed (or a recipe's `bind_cores: true`) where the ranks start here and numactl is not
    installed: one line now rather than every rank's FileNotFoundError from DeepSpeed's launcher."""
    if settings.bind_cores and binds_here(settings) and shutil.which("numactl") is None:
        raise UserInputError(NUMACTL_MISSING)


def core_binding(plan: Plan, settings: Settings, launcher_args: tuple[str, ...] = ()) -> CoreBinding:
    """--bind-cores / --no-bind-cores as typed; by default (None) on when the optimizer steps on the CPU (the
    plan offloads it) and numactl is installed. DeepSpeed's launcher (deepspeed/launcher/launch.py with
    deepspeed/utils/numa.py get_numactl_cmd) then splits the first psutil.cpu_count(logical=False) cores into
    equal consecutive shares, starts each rank under `numactl [-m NODE] -C FIRST-LAST` (NODE: the NUMA node
    holding the share) and sets the rank's OMP_NUM_THREADS to its share. DeepSpeed's core-binding blog measured
    2.89 -> 2.50 s/step for Qwen2.5-3B, ZeRO-2 + optimizer on CPU on 2 x A100.
    The default stays off where binding would fail or cannot be checked: with --hostfile (numactl on the other
    machines), with fewer cores than ranks (numa.py asserts one core per rank), with KMP_AFFINITY set (numa.py
    refuses it), and on this machine when numactl cannot bind at all (a container's seccomp profile or cpuset).
    The one-line note says which."""
    if settings.bind_cores is not None:
        check_bind_cores(settings)
        return CoreBinding(settings.bind_cores)
    if plan.chosen.strategy.offload_optimizer == "none":
        return CoreBinding(False)
    flag = "DeepSpeed --bind_cores_to_rank"
    if not binds_here(settings):
        return CoreBinding(
            False,
            "ranks not bound to cores by default with --hostfile (numactl on the other hosts is not checked from "
            f"here): --bind-cores pins each to its share ({flag})",
        )
    if shutil.which("numactl") is None:
        return CoreBinding(
            False,
            "ranks not bound to cores: installing numactl (apt-get install numactl) would pin each to its share "
            f"({flag}, faster optimizer steps on the CPU)",
        )
    cores, ranks = plan.host.cpu_cores, plan.ranks_per_node
    if cores < ranks:
        return CoreBinding(
            False,
            f"ranks not bound to cores ({flag}): {cores} core{'s' * (cores != 1)} for {ranks} ranks, it needs one each",
        )
    if "KMP_AFFINITY" in os.environ:
        return CoreBinding(False, f"ranks not bound to cores ({flag}): DeepSpeed refuses it while KMP_AFFINITY is set")
    if plan.host.source == "live" and not any(arg.startswith("--bind_core_list") for arg in launcher_args):
        problem = numactl_problem(bind_core_list(plan, settings, launcher_args) or f"0-{cores - 1}")
        if problem:
            return CoreBinding(False, f"ranks not bound to cores ({flag}): numactl cannot bind here ({problem})")
    return CoreBinding(
        True,
        f"binding each rank to its share of the cores (numactl, {flag}): the optimizer steps on the CPU; "
        "--no-bind-cores turns it off",
    )


def bind_core_list(plan: Plan, settings: Settings, launcher_args: tuple[str, ...]) -> str | None:
    """DeepSpeed's --bind_core_list for ranks started here on a live host whose usable cores (inspection/limits.py:
    the affinity mask, one CPU per physical core, trimmed to a CFS quota) are not the CPUs DeepSpeed takes by
    default, 0..psutil.cpu_count(logical=False)-1 (deepspeed/utils/numa.py get_numactl_cmd): under `taskset -c 4-7`
    those are CPUs numactl may not use and every rank dies at start. None: the default is right, the host is
    described or remote, or the user gave their own list after `--`."""
    import psutil

    from launcher.inspection.host import usable_cores
    from launcher.inspection.limits import core_list

    if plan.host.source != "live" or not binds_here(settings):
        return None
    if any(arg.startswith("--bind_core_list") for arg in launcher_args):
        return None
    cores = usable_cores()
    if cores == list(range(psutil.cpu_count(logical=False) or 0)):
        return None
    return core_list(cores)


def numactl_problem(cpus: str) -> str | None:
    """Why numactl cannot bind this process as DeepSpeed will (memory to node 0, the CPUs `cpus`: "0-7"), in
    numactl's own words; None when it can. A container may refuse set_mempolicy (Docker's default seccomp profile
    without CAP_SYS_NICE) or CPUs outside its cpuset."""
    argv = ["numactl", "-m", "0", "-C", cpus, "true"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc) or type(exc).__name__
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return f"{shlex.join(argv)}: {lines[0] if lines else f'exit {proc.returncode}'}"
