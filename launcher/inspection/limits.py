"""What this process may use of its machine: the cgroup's memory limit and the CPUs of its affinity mask.

A container (Docker's `--memory`, Kubernetes' limits), a Slurm allocation or `taskset` gives a job less than the
node: planning for the node's RAM is an OOM kill the plan called a fit, and counting its cores gives each rank
threads it cannot run (and DeepSpeed's core binding cores it may not use). Everything here reads files, so a test
points it at a fake /proc and /sys.

[source] cgroup v2: Documentation/admin-guide/cgroup-v2.rst (memory.max, "max" when unlimited; memory.current;
memory.stat's inactive_file; cpu.max "$MAX $PERIOD"). cgroup v1: Documentation/admin-guide/cgroup-v1/memory.rst
(memory.limit_in_bytes, a page-rounded LONG_MAX when unlimited; memory.usage_in_bytes; memory.stat's
total_inactive_file) and cfs-bandwidth (cpu.cfs_quota_us, -1 when unlimited; cpu.cfs_period_us). The working set,
usage less inactive file pages, is what the kubelet and `docker stats` count against the limit: the kernel reclaims
inactive page cache before it kills.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
SYS_CPU = "/sys/devices/system/cpu"
UNLIMITED = 1 << 60  # v1 writes an unlimited limit as LONG_MAX rounded down to a page; anything this large is none


@dataclass(frozen=True)
class MemoryLimit:
    """The tightest memory limit on this process's cgroup and its ancestors, and its cgroup's working set."""

    limit_bytes: int
    working_set_bytes: int
    file: str  # the limit's file, for the note that names it

    @property
    def available_bytes(self) -> int:
        return max(0, self.limit_bytes - self.working_set_bytes)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    """A limit file's value in bytes; None when absent or unlimited ("max", -1, v1's LONG_MAX)."""
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value < UNLIMITED else None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.isdigit():
            return int(value)
    return 0


def cgroup_paths(proc_cgroup: str = PROC_CGROUP) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 hierarchy (`0::/path`) under "" ."""
    paths: dict[str, str] = {}
    for line in (_read(Path(proc_cgroup)) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _up_from(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and each ancestor's up to the mount. Inside a container the path /proc shows is the
    host's while the mount is the container's own cgroup: a folder that is not there is skipped (the mount's own
    files, the container's limit, still count)."""
    parts = [p for p in path.split("/") if p]
    folders = [mount.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)]
    return [f for f in folders if f.is_dir()] + [mount]


def memory_limit(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> MemoryLimit | None:
    """The memory limit this process runs under (v2, else v1), None when there is none."""
    paths, base = cgroup_paths(proc_cgroup), Path(root)
    if "memory" in paths:  # v1: the memory controller has its own hierarchy
        layout = (base / "memory", paths["memory"], "memory.limit_in_bytes", "memory.usage_in_bytes")
        inactive = "total_inactive_file"
    elif "" in paths and (base / "cgroup.controllers").exists():  # v2: one unified hierarchy
        layout = (base, paths[""], "memory.max", "memory.current")
        inactive = "inactive_file"
    else:
        return None
    mount, path, limit_name, usage_name = layout
    folders = _up_from(mount, path)
    limits = [(value, folder) for folder in folders if (value := _number(_read(folder / limit_name))) is not None]
    if not limits:
        return None
    limit, folder = min(limits, key=lambda pair: pair[0])
    leaf = folders[0]
    usage = _number(_read(leaf / usage_name)) or 0
    working_set = max(0, usage - _stat(leaf / "memory.stat", inactive))
    return MemoryLimit(limit, working_set, str(folder / limit_name))


def cpu_quota(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> float | None:
    """The CPUs' worth of time a CFS quota allows (2.5 for 250 ms per 100 ms), None when unlimited."""
    paths, base = cgroup_paths(proc_cgroup), Path(root)
    quotas: list[float] = []
    if "cpu" in paths:
        for folder in _up_from(base / "cpu", paths["cpu"]):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota and period and quota.lstrip("-").isdigit() and int(quota) > 0 and int(period) > 0:
                quotas.append(int(quota) / int(period))
    elif "" in paths:
        for folder in _up_from(base, paths[""]):
            fields = (_read(folder / "cpu.max") or "").split()
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]) > 0:
                quotas.append(int(fields[0]) / int(fields[1]))
    return min(quotas) if quotas else None


def allowed_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask: taskset, a cpuset, Slurm's allocation)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int], sys_cpu: str = SYS_CPU) -> list[int]:
    """One logical CPU per physical core among `cpus` (the lowest-numbered thread of each): a hyper-thread
    sibling is no extra core for matmuls or CPU-Adam. CPUs whose topology cannot be read count as cores."""
    seen: set[tuple[str, str]] = set()
    cores = []
    for cpu in cpus:
        topology = Path(sys_cpu) / f"cpu{cpu}" / "topology"
        key = (_read(topology / "physical_package_id") or "", _read(topology / "core_id") or f"cpu{cpu}")
        if key not in seen:
            seen.add(key)
            cores.append(cpu)
    return cores


def usable_cores(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT, sys_cpu: str = SYS_CPU) -> list[int]:
    """The physical cores this process may use: its affinity mask's, trimmed (from the top) to a CFS quota."""
    cores = physical_cores(allowed_cpus(), sys_cpu)
    quota = cpu_quota(proc_cgroup, root)
    if quota is not None:
        cores = cores[: max(1, math.floor(quota))]
    return cores


def core_list(cores: list[int]) -> str:
    """`cores` as DeepSpeed's --bind_core_list wants them (deepspeed/utils/numa.py parse_range_list: ascending,
    non-overlapping "a-b" or "a" items, comma-separated): [0, 1, 2, 5] -> "0-2,5"."""
    items: list[str] = []
    start = previous = None
    for core in sorted(cores):
        if previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            items.append(f"{start}-{previous}" if previous != start else f"{start}")
        start = previous = core
    if start is not None:
        items.append(f"{start}-{previous}" if previous != start else f"{start}")
    return ",".join(items)
