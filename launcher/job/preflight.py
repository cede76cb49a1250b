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

from launcher.errors import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, Stopped, UserInputError
from launcher.files import folder_bytes
from launcher.inspection import host as live_host
from launcher.inspection.host import aio_usable, can_lock_unlimited, op_usable
from launcher.job import build_locks, launch
from launcher.job.rundir import SWAP_OWNER_FILE, SWAP_PREFIX
from launcher.plan.capacity import NVME_USABLE_FRACTION
from launcher.plan.planner import Plan
from launcher.units import fmt_bytes

# DeepSpeed's CPU shared-memory allreduce (csrc/cpu/comm/shm.cpp) maps one `allreduce_workspace` per rank in
# /dev/shm: 2 x NAIVE_ALLREDUCE_THRESHOLD (1 MiB) + 2 x MAX_BUF_SIZE (32 MiB) = 66 MiB.
SHM_BYTES_PER_CPU_RANK = 2 * 2**20 + 2 * 32 * 2**20
# NCCL keeps its intra-node buffers in /dev/shm; docker's default 64 MiB is the classic failure, and NCCL's
# troubleshooting guide suggests --shm-size=1g.
SHM_BYTES_FOR_NCCL = 2**30
SHM_PATH = "/dev/shm"


def check_nvme_room(
    path: str, needed_bytes: int, strategy: str, what: str = "--nvme-path", reusable_bytes: int = 0
) -> None:
    """Before launch: the real folder behind a plan made for a described host must hold the plan's swap
    files (the plan only saw the description's `nvme.free`). Same headroom as the planner's.
    `reusable_bytes`: the run's own swap files a killed run left, which its resume overwrites."""
    free = live_host.disk_free_bytes(live_host.check_nvme_folder(path, what)) + reusable_bytes
    if needed_bytes > free * NVME_USABLE_FRACTION:
        raise UserInputError(
            f"{what} {path} has {fmt_bytes(free)} free, but {strategy} needs {fmt_bytes(needed_bytes)} of swap "
            f"files there; free space on that drive, or pass a folder with at least "
            f"{fmt_bytes(needed_bytes / NVME_USABLE_FRACTION)} free"
        )


@dataclass(frozen=True)
class Problem:
    check: str  # memlock | shm | ram | async_io | cpu_adam | cuda_toolkit
    message: str
    exit_code: int = EXIT_BAD_INPUT
    fatal: bool = True  # False: printed as a warning, the run goes on


# The checks by name: HOST_CHECKS need only the plan; CONFIG_CHECKS read the final ds_config, so a run that
# makes it after the host checks (train.prepare_run) runs them separately, before anything is written.
HOST_CHECKS = ("ram", "shm", "memlock", "async_io", "cpu_adam", "nvme_leftovers")
CONFIG_CHECKS = ("cuda_toolkit",)
ALL_CHECKS = HOST_CHECKS + CONFIG_CHECKS


def find_problems(
    plan: Plan, own_swap_dir: str | None = None, config: dict | None = None, *, checks: tuple[str, ...] = ALL_CHECKS
) -> list[Problem]:
    """Every problem this host has with the plan's chosen strategy (an empty list: go). `own_swap_dir` is this
    run's folder under --nvme-path: other runs' folders there are reported, this one is reused. `config`: the
    final ds_config when known (a user's config can turn torch_adam off); else the one the plan renders.
    `checks`: the names of the checks to make (HOST_CHECKS, CONFIG_CHECKS; all by default)."""
    if plan.chosen is None or plan.host.source != "live":
        return []
    named = {"ram": _ram, "shm": _shm, "memlock": _memlock, "async_io": _async_io, "cpu_adam": _cpu_adam}
    found = [named[name](plan) for name in named if name in checks]
    if "cuda_toolkit" in checks:
        found.append(_cuda_toolkit(plan, config))
    problems = [problem for problem in found if problem is not None]
    nvme_path = plan.workload.nvme_path or (plan.host.nvme.path if plan.host.nvme else None)
    if nvme_path and "nvme_leftovers" in checks:
        problems.extend(stale_swap_problems(nvme_path, own_swap_dir))
    return problems


def _ram(plan: Plan) -> Problem | None:
    """RAM available now, not only installed: other jobs on a shared machine hold some of it."""
    from launcher.inspection.host import available_memory_bytes

    available = available_memory_bytes()  # within the cgroup's limit, where one is set
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
    """RLIMIT_MEMLOCK bounds what a process mlock()s. DeepSpeed mlocks the NVMe swap buffers itself
    (new_cpu_locked_tensor -> ds_page_aligned_alloc: posix_memalign + mlock, then `assert(nullptr !=
    pinned_buffer)` in csrc/pin_memory), whatever pin_memory says, and with DS_PIN_MEMORY_BACKEND=native every
    pinned buffer too. torch's own pinning (cudaHostAlloc, the default backend) is locked by the NVIDIA driver
    and not charged: pin_memory alone needs no limit (planner.pins_host_memory)."""
    host = plan.host
    if host.memlock_bytes is None or can_lock_unlimited():
        return None
    from launcher.plan.planner import locked_swap_bytes_per_rank, pinned_bytes_per_rank

    native = _native_pinning() and plan.pin_memory and plan.chosen.strategy.offloads
    if native:
        need = max(pinned_bytes_per_rank(plan.chosen, plan.ranks_per_node), 0)
        what = "pinned buffers DeepSpeed mlocks per rank (DS_PIN_MEMORY_BACKEND=native)"
        fix = "or unset DS_PIN_MEMORY_BACKEND to let torch pin"
    else:
        need = locked_swap_bytes_per_rank(plan.chosen, plan.ranks_per_node)
        what = "NVMe swap buffers DeepSpeed mlocks per rank (its aio buffers, whatever pin_memory says)"
        fix = "or lower the swap buffers (--offload-* cpu, a smaller sub_group_size / buffer_size)"
    if not need or host.memlock_bytes >= need:
        return None
    return Problem(
        "memlock",
        f"memlock limit {fmt_bytes(host.memlock_bytes)} < {fmt_bytes(need)} of {what}: raise it with "
        f"`ulimit -l unlimited` (docker: --ulimit memlock=-1; Slurm/systemd: LimitMEMLOCK=infinity), {fix}",
    )


def _native_pinning() -> bool:
    """DeepSpeed's DS_PIN_MEMORY_BACKEND=native pins through its mlock allocator (utils/pin_memory.py)."""
    return os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() == "native"


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


# DeepSpeed ops that are CUDAOpBuilders: on a CUDA host their JIT build (builder.py jit_load) runs with
# with_cuda=True and nvcc_args() calls installed_cuda_version(), i.e. CUDA_HOME/bin/nvcc -V: fused_adam
# compiles multi_tensor_adam.cu; async_io has no .cu file but adds CUDA_HOME/include and links -lcudart.
# CPUAdamBuilder is the CPU builder on every accelerator (cuda_accelerator.py `_lazy_init_class_dict`).
CUDA_OP_BUILD_VARS = {"fused_adam": "DS_BUILD_FUSED_ADAM", "async_io": "DS_BUILD_AIO"}


def cuda_ops_needed(plan: Plan, config: dict | None = None) -> list[str]:
    """The CUDA-compiled ops the plan's ds_config makes DeepSpeed load on a GPU host."""
    if not plan.host.has_gpu:
        return []
    strategy = plan.chosen.strategy
    ops = []
    if strategy.offload_optimizer == "none" and not _asks_torch_adam(plan, config):
        ops.append("fused_adam")
    if "nvme" in (strategy.offload_optimizer, strategy.offload_param):
        ops.append("async_io")
    return ops


def _asks_torch_adam(plan: Plan, config: dict | None) -> bool:
    if config is None:
        from launcher.config.dsconfig import uses_torch_adam

        return uses_torch_adam(plan)
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, dict):
        return True  # no DeepSpeed optimizer: the client's, nothing built here
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return True
    params = optimizer.get("params")
    return isinstance(params, dict) and params.get("torch_adam") is True


def _cuda_toolkit(plan: Plan, config: dict | None = None) -> Problem | None:
    ops = [op for op in cuda_ops_needed(plan, config) if not _prebuilt_for_cuda(op)]
    if not ops:
        return None
    missing = cuda_toolkit_missing()
    if missing is None:
        return None
    torch_cuda = _torch_cuda_version() or "of this torch"
    return Problem(
        "cuda_toolkit",
        f"DeepSpeed must compile its {' and '.join(ops)} op{'s' if len(ops) > 1 else ''} for this GPU plan, "
        f"but {missing}: install the CUDA toolkit {torch_cuda} (nvcc; e.g. conda install -c nvidia "
        f"cuda-nvcc={torch_cuda}) and set CUDA_HOME to it, or install DeepSpeed with the op prebuilt "
        f"({prebuild_command(plan, ops)})",
    )


def prebuild_command(plan: Plan, ops: list[str]) -> str:
    """The pip command that installs DeepSpeed with `ops` compiled in, for this plan's GPUs. Outside its JIT mode
    DeepSpeed compiles for TORCH_CUDA_ARCH_LIST, else its defaults (op_builder/builder.py
    get_default_compute_capabilities: "6.0;6.1;7.0", plus 8.0-9.0 under CUDA 12, which CUDA 13's nvcc refuses:
    it dropped those older architectures), so the list names the GPU's own capability. --no-build-isolation: its
    setup.py imports the installed torch (an isolated build would fetch another); --no-cache-dir: pip would reuse
    a cached DeepSpeed wheel built without the ops."""
    variables = " ".join(f"{CUDA_OP_BUILD_VARS[op]}=1" for op in ops)
    capability = plan.host.gpus.compute_capability
    if capability:
        variables = f"TORCH_CUDA_ARCH_LIST={capability[0]}.{capability[1]} {variables}"
    return f"{variables} pip install --no-build-isolation --no-cache-dir deepspeed"


def _torch_cuda_version() -> str | None:
    import torch

    return torch.version.cuda


def _cuda_home() -> str | None:
    """Where torch's extension builder (and so DeepSpeed's) looks for the toolkit: CUDA_HOME / CUDA_PATH, the
    folder above `nvcc` on PATH, else /usr/local/cuda (torch/utils/cpp_extension.py `_find_cuda_home`)."""
    from torch.utils.cpp_extension import CUDA_HOME

    return CUDA_HOME


def _nvcc_release(cuda_home: str) -> str | None:
    """`nvcc -V`'s release (e.g. "12.4"), as DeepSpeed's installed_cuda_version reads it; None if it cannot run."""
    import subprocess

    try:
        output = subprocess.run(
            [os.path.join(cuda_home, "bin", "nvcc"), "-V"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        words = output.split()
        return words[words.index("release") + 1].rstrip(",")
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def cuda_toolkit_missing() -> str | None:
    """What stops DeepSpeed's JIT build of a CUDA op here (None: nothing): no toolkit, an nvcc that does not
    run (a runtime-only install), or one whose major version differs from torch's CUDA (torch refuses that
    combination: cpp_extension `_check_cuda_version`)."""
    torch_cuda = _torch_cuda_version()
    if torch_cuda is None:
        return "this torch is built without CUDA"
    home = _cuda_home()
    if home is None:
        return "no CUDA toolkit was found (CUDA_HOME unset, no nvcc on PATH, no /usr/local/cuda)"
    release = _nvcc_release(home)
    if release is None:
        return f"{home}/bin/nvcc does not run (CUDA_HOME={home} holds no compiler)"
    if release.split(".")[0] != torch_cuda.split(".")[0]:
        return f"nvcc at {home} is CUDA {release} and torch is built for CUDA {torch_cuda}"
    return None


def _prebuilt_for_cuda(op: str) -> bool:
    """Prebuilt into the installed wheel for the CUDA accelerator: OpBuilder.load imports it, no compiler."""
    if not _prebuilt_ops().get(op, False):
        return False
    try:
        from deepspeed.git_version_info import accelerator_name
    except ImportError:
        return False
    return accelerator_name == "cuda"


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
    """The ops compiled into the installed DeepSpeed ({name: bool}): its git_version_info_installed.py, which its
    setup.py writes (`installed_ops`), read as text: importing DeepSpeed imports torch (3-5 s of every command)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py").read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError):
        return {}  # a source checkout: nothing prebuilt
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "installed_ops" for t in node.targets):
            try:
                ops = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return dict(ops) if isinstance(ops, dict) else {}
    return {}


def _ninja_available() -> bool:
    """What torch's JIT builder requires (torch/utils/cpp_extension.py is_ninja_available: `ninja --version` runs),
    asked the same way without importing torch."""
    import subprocess

    try:
        subprocess.run(["ninja", "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def shm_leftovers(*, remove: bool) -> tuple[list[launch.ShmBuffer], str | None]:
    """DeepSpeed's allreduce buffers that killed runs left in /dev/shm (their owners gone: no live process maps
    them; a launcher that returns removes its own run's). A real run removes them, so that the /dev/shm check
    and the run itself see the room; a dry run only says what that would free. The buffers and the line that
    says so (None when there were none)."""
    shm_dir = Path(SHM_PATH)
    buffers = launch.remove_orphaned_shm_buffers(shm_dir) if remove else launch.orphaned_shm_buffers(shm_dir)
    if not buffers:
        return buffers, None
    size = fmt_bytes(sum(buffer.bytes for buffer in buffers))
    what = f"{len(buffers)} DeepSpeed allreduce buffer{'s' if len(buffers) != 1 else ''} left by killed runs"
    if remove:
        return buffers, f"freed {size} of {SHM_PATH}: {what} (owners gone)"
    return buffers, f"warning: {SHM_PATH} holds {size} in {what} (owners gone); a real run removes them"


def enforce(
    plan: Plan,
    own_swap_dir: str | None,
    *,
    fatal: bool,
    warn: Callable[[str], None],
    config: dict | None = None,
    checks: tuple[str, ...] = ALL_CHECKS,
) -> None:
    """This machine's limits against the plan, before anything is written or started: every non-fatal problem
    (all of them when not `fatal`, as in a dry run) goes to `warn`; then the first fatal one stops the run
    with its exit code. First a real run frees the /dev/shm that killed runs left (`shm_leftovers`), when the
    /dev/shm check is among `checks`, and says so when the run goes ahead, and removes the JIT-build locks killed
    builds left (build_locks.py; a dry run on this machine says what it would remove). `config`: the final
    ds_config (see find_problems)."""
    freed = None
    if "shm" in checks and (fatal or plan.host.source == "live"):
        _buffers, freed = shm_leftovers(remove=fatal)
    if fatal or plan.host.source == "live":  # a killed JIT build's lock would hang the ranks, silently
        build_locks.clear_stale_locks(os.environ, remove=fatal, warn=warn)
    problems = find_problems(plan, own_swap_dir, config, checks=checks)
    for problem in problems:
        if not (fatal and problem.fatal):
            warn(f"warning: {problem.message}")
    for problem in problems:
        if fatal and problem.fatal:
            raise Stopped(problem.message, problem.exit_code)
    if freed:  # said once the run goes ahead: a refusal stays the one line it is
        warn(freed)
