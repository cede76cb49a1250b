"""inspection/limits.py: a cgroup's memory limit and CPU quota, the affinity mask, read from fake /proc and /sys
trees (both cgroup versions), and for real where this machine allows it (`taskset`, a v1 memory cgroup as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.inspection import limits

GiB = 1 << 30


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_v1_takes_the_tightest_limit_on_the_way_up_and_counts_the_working_set(tmp_path):
    proc = tree(tmp_path, {"cgroup": "4:memory:/slurm/job7\n3:cpuset:/\n"})
    fs = tree(
        tmp_path / "fs",
        {
            "memory/memory.limit_in_bytes": "9223372036854771712",  # unlimited, as v1 writes it
            "memory/slurm/memory.limit_in_bytes": str(64 * GiB),
            "memory/slurm/job7/memory.limit_in_bytes": str(16 * GiB),
            "memory/slurm/job7/memory.usage_in_bytes": str(6 * GiB),
            "memory/slurm/job7/memory.stat": f"cache 1\ntotal_inactive_file {2 * GiB}\n",
        },
    )
    found = limits.memory_limit(str(proc / "cgroup"), str(fs))
    assert found.limit_bytes == 16 * GiB and found.working_set_bytes == 4 * GiB
    assert found.available_bytes == 12 * GiB and found.file.endswith("job7/memory.limit_in_bytes")


def test_v2_reads_memory_max_and_a_container_sees_its_own_root(tmp_path):
    # in a container /proc shows the host's path, the mount is the container's own cgroup: its root files count
    proc = tree(tmp_path, {"cgroup": "0::/system.slice/docker-abc.scope\n"})
    fs = tree(
        tmp_path / "fs",
        {
            "cgroup.controllers": "cpu memory",
            "memory.max": str(8 * GiB),
            "memory.current": str(3 * GiB),
            "memory.stat": f"anon 1\ninactive_file {GiB}\n",
            "cpu.max": "250000 100000",
        },
    )
    found = limits.memory_limit(str(proc / "cgroup"), str(fs))
    assert (found.limit_bytes, found.working_set_bytes) == (8 * GiB, 2 * GiB)
    assert limits.cpu_quota(str(proc / "cgroup"), str(fs)) == 2.5
    (fs / "memory.max").write_text("max\n")
    (fs / "cpu.max").write_text("max 100000\n")
    assert limits.memory_limit(str(proc / "cgroup"), str(fs)) is None
    assert limits.cpu_quota(str(proc / "cgroup"), str(fs)) is None


def test_v1_cpu_quota_and_no_cgroup_at_all(tmp_path):
    proc = tree(tmp_path, {"cgroup": "1:cpu,cpuacct:/job\n"})
    fs = tree(tmp_path / "fs", {"cpu/job/cpu.cfs_quota_us": "150000", "cpu/job/cpu.cfs_period_us": "100000"})
    assert limits.cpu_quota(str(proc / "cgroup"), str(fs)) == 1.5
    (fs / "cpu/job/cpu.cfs_quota_us").write_text("-1")
    assert limits.cpu_quota(str(proc / "cgroup"), str(fs)) is None
    assert limits.memory_limit(str(tmp_path / "absent"), str(fs)) is None


def test_hyperthread_siblings_are_one_core(tmp_path):
    # 4 logical CPUs, siblings numbered apart (0/2 and 1/3 share a core), as on most Intel machines
    sys_cpu = tree(
        tmp_path,
        {
            f"cpu{c}/topology/{k}": v
            for c in range(4)
            for k, v in (("physical_package_id", "0"), ("core_id", str(c % 2)))
        },
    )
    assert limits.physical_cores([0, 1, 2, 3], str(sys_cpu)) == [0, 1]
    assert limits.physical_cores([2, 3], str(sys_cpu)) == [2, 3]


def test_core_list_is_deepspeeds_range_syntax():
    from deepspeed.utils.numa import parse_range_list

    for cores in ([0], [0, 1, 2, 5], [3, 4, 7, 8, 9, 12], list(range(16))):
        assert parse_range_list(limits.core_list(cores)) == cores
    assert limits.core_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


INSPECT = (
    "import json; from launcher.inspection.host import inspect_host; h = inspect_host(); "
    "print(json.dumps([h.cpu_cores, h.cpu_memory_bytes, h.cpu_memory_available_bytes, list(h.notes)]))"
)


def inspect_in(argv_prefix: list[str], **popen) -> list:
    out = subprocess.run([*argv_prefix, sys.executable, "-c", INSPECT], capture_output=True, text=True, **popen)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset, 2 CPUs")
def test_taskset_gives_the_host_one_core():
    cores, _, _, notes = inspect_in(["taskset", "-c", "1"])
    assert cores == 1
    assert any("cores usable here" in n and "(affinity mask or CPU quota: 1)" in n for n in notes), notes


V1_MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(
    not (os.geteuid() == 0 and os.access(V1_MEMORY, os.W_OK) and "memory:" in Path("/proc/self/cgroup").read_text()),
    reason="needs root and a writable cgroup v1 memory hierarchy",
)
def test_a_real_v1_memory_cgroup_limits_the_hosts_ram():
    group = V1_MEMORY / f"offload-launch-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(3 * GiB))

        def enter():  # the child joins the cgroup before it runs anything
            (group / "cgroup.procs").write_text(str(os.getpid()))

        cores, total, available, notes = inspect_in([], preexec_fn=enter)
        assert total == 3 * GiB and 0 < available < 3 * GiB
        assert any("cgroup allows 3.0 GiB" in n and str(group) in n for n in notes), notes
    finally:
        group.rmdir()
