"""Host checks made just before launch, on the machine that will train: what the plan cannot see from a
description, and what would otherwise fail minutes into a run (FIELD-NOTES: memlock, /dev/shm, libaio,
ops that cannot be compiled). Each failed check is one line with the value and the fix.

Only a live host is checked: a described host is, by definition, some other machine.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.deepspeed_logging import import_deepspeed
from launcher.errors import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, Stopped
from launcher.files import folder_bytes
from launcher.inspection.host import aio_usable, op_usable
from launcher.job import launch
from launcher.job.rundir import SWAP_OWNER_FILE, SWAP_PREFIX
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes

# DeepSpeed's CPU shared-memory allreduce (csrc/cpu/comm/shm.cpp) maps one `allreduce_workspace` per rank in
# /dev/shm: 2 x NAIVE_ALLREDUCE_THRESHOLD (1 MiB) + 2 x MAX_BUF_SIZE (32 MiB) = 66 MiB.
SHM_BYTES_PER_CPU_RANK = 2 * 2**20 + 2 * 32 * 2**20
# NCCL keeps its intra-node buffers in /dev/shm; docker's default 64 MiB is the classic failure, and NCCL's
# troubleshooting guide suggests --shm-size=1g.
SHM_BYTES_FOR_NCCL = 2**30
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class Problem:
    check: str  # memlock | shm | ram | async_io | cpu_adam
    message: str
    exit_code: int = EXIT_BAD_INPUT
    fatal: bool = True  # False: printed as a warning, the run goes on


def find_problems(plan: Plan, own_swap_dir: str | None = None) -> list[Problem]:
    """Every problem this host has with the plan's chosen strategy (an empty list: go). `own_swap_dir` is this
    run's folder under --nvme-path: other runs' folders there are reported, this one is reused."""
    if plan.chosen is None or plan.host.source != "live":
        return []
    found = [check(plan) for check in (_ram, _shm, _memlock, _async_io, _cpu_adam)]
    problems = [problem for problem in found if problem is not None]
    nvme_path = plan.workload.nvme_path or (plan.host.nvme.path if plan.host.nvme else None)
    if nvme_path:
        problems.extend(stale_swap_problems(nvme_path, own_swap_dir))
    return problems


def _ram(plan: Plan) -> Problem | None:
    """RAM available now, not only installed: other jobs on a shared machine hold some of it."""
    import psutil

    available = int(psutil.virtual_memory().available)
    needed = plan.chosen.memory.cpu_bytes
    if needed <= available:
        return None
    return Problem(
        "ram",
        f"the plan needs {fmt_bytes(needed)} of CPU RAM but only {fmt_bytes(available)} is available now "
        f"({fmt_bytes(plan.host.cpu_memory_bytes)} installed); stop other jobs, or lower --micro-batch/--seq-len",
        EXIT_DOES_NOT_FIT,
    )


def _shm(plan: Plan) -> Problem | None:
    ranks = plan.ranks_per_node
    if ranks <= 1:
        return None
    need_shm = SHM_BYTES_FOR_NCCL if plan.host.has_gpu else ranks * SHM_BYTES_PER_CPU_RANK
    free_shm = _free_bytes(SHM_PATH)
    if free_shm is None or free_shm >= need_shm:
        return None
    return Problem(
        "shm",
        f"/dev/shm has {fmt_bytes(free_shm)} free, {ranks} ranks on this node need "
        f"{fmt_bytes(need_shm)} for DeepSpeed's shared-memory communication; start the container "
        f"with --shm-size={max(1, -(-need_shm // 2**30))}g (or mount -o remount,size=... /dev/shm)",
    )


def _memlock(plan: Plan) -> Problem | None:
    host = plan.host
    if not (plan.pin_memory and plan.chosen.strategy.offloads and host.memlock_bytes is not None):
        return None
    from launcher.plan.planner import pinned_bytes_per_rank

    need = pinned_bytes_per_rank(plan.chosen, plan.ranks_per_node)
    if host.memlock_bytes >= need:  # the plan turns pinning off itself; this catches a changed limit
        return None
    return Problem(
        "memlock",
        f"memlock limit {fmt_bytes(host.memlock_bytes)} < {fmt_bytes(need)} of pinned buffers per "
        "rank; run `ulimit -l unlimited` (docker: --ulimit memlock=-1) or set pin_memory: false",
    )


def _async_io(plan: Plan) -> Problem | None:
    strategy = plan.chosen.strategy
    if "nvme" not in (strategy.offload_optimizer, strategy.offload_param) or aio_usable():
        return None
    return Problem(
        "async_io",
        "NVMe offload needs DeepSpeed's async_io op, which cannot be built here (libaio missing): "
        "install libaio-dev (Debian/Ubuntu: apt-get install libaio-dev) or libaio-devel (RHEL)",
    )


def _cpu_adam(plan: Plan) -> Problem | None:
    if plan.chosen.strategy.offload_optimizer == "none" or cpu_adam_buildable():
        return None
    return Problem(
        "cpu_adam",
        "the optimizer is offloaded but DeepSpeed's CPU-Adam op is neither prebuilt nor buildable here: "
        "install a C++ compiler and ninja (apt-get install g++ ninja-build, or pip install ninja)",
    )


def stale_swap_problems(nvme_path: str, own_swap_dir: str | None) -> list[Problem]:
    """Swap folders other runs left under --nvme-path (a run that was killed keeps its folder so its resume
    can reuse it; a finished run removes its own). Never fatal, never deleted here: they are said out loud."""
    problems = []
    for folder in sorted(Path(nvme_path).glob(f"{SWAP_PREFIX}*")):
        if not folder.is_dir() or (own_swap_dir and folder == Path(own_swap_dir)):
            continue
        owner = _read_owner(folder)
        problems.append(
            Problem(
                "nvme_leftovers",
                f"{folder} holds {fmt_bytes(folder_bytes(folder))} of swap files from the unfinished run in {owner}: "
                "rerun that run to resume (it reuses them), or delete the folder to free the space",
                fatal=False,
            )
        )
    return problems


def _read_owner(folder: Path) -> str:
    try:
        return json.loads((folder / SWAP_OWNER_FILE).read_text())["output_dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown folder"


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def cpu_adam_buildable() -> bool:
    """DeepSpeedCPUAdam runs when its op was prebuilt into the DeepSpeed wheel (DS_BUILD_CPU_ADAM=1), or when
    DeepSpeed can JIT-compile it: a compatible builder, a C++ compiler and ninja."""
    with_prebuilt = _prebuilt_ops().get("cpu_adam", False)
    if with_prebuilt:
        return True
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    return bool(compiler) and _ninja_available() and op_usable("CPUAdamBuilder")


def _prebuilt_ops() -> dict:
    try:
        import_deepspeed()
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return {}
    return dict(installed_ops)


def _ninja_available() -> bool:
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except ImportError:
        return shutil.which("ninja") is not None
    return is_ninja_available()


def shm_leftovers(*, remove: bool, warn: Callable[[str], None]) -> list[launch.ShmBuffer]:
    """DeepSpeed's allreduce buffers that killed runs left in /dev/shm (their owners gone: no live process maps
    them; a launcher that returns removes its own run's). A real run removes them, so that the /dev/shm check
    and the run itself see the room; a dry run only says what that would free."""
    shm_dir = Path(SHM_PATH)
    buffers = launch.remove_orphaned_shm_buffers(shm_dir) if remove else launch.orphaned_shm_buffers(shm_dir)
    if buffers:
        size = fmt_bytes(sum(buffer.bytes for buffer in buffers))
        what = f"{len(buffers)} DeepSpeed allreduce buffer{'s' if len(buffers) != 1 else ''} left by killed runs"
        if remove:
            warn(f"freed {size} of {SHM_PATH}: {what} (owners gone)")
        else:
            warn(f"warning: {SHM_PATH} holds {size} in {what} (owners gone); a real run removes them")
    return buffers


def enforce(plan: Plan, own_swap_dir: str | None, *, fatal: bool, warn: Callable[[str], None]) -> None:
    """This machine's limits against the plan, before anything is written or started: every non-fatal problem
    (all of them when not `fatal`, as in a dry run) goes to `warn`; then the first fatal one stops the run
    with its exit code. First a real run frees the /dev/shm that killed runs left (`shm_leftovers`)."""
    if fatal or plan.host.source == "live":
        shm_leftovers(remove=fatal, warn=warn)
    problems = find_problems(plan, own_swap_dir)
    for problem in problems:
        if not (fatal and problem.fatal):
            warn(f"warning: {problem.message}")
    for problem in problems:
        if fatal and problem.fatal:
            raise Stopped(problem.message, problem.exit_code)
