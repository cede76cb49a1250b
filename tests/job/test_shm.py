"""Memory that is not what it seems: an --nvme-path on a file system in RAM is refused (its swap files would be
the CPU RAM the plan already counts), and the 66 MiB DeepSpeed allreduce buffers killed runs leave in /dev/shm
are found by their missing owners and freed before the next real run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli as cli_group
from launcher.errors import UserInputError
from launcher.inspection.host import inspect_host, inspect_nvme, memory_backed_mount, mount_of, parse_mountinfo
from launcher.inspection.model import inspect_model
from launcher.job import launch, preflight
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from tests.helpers import offload_launch

SHM = Path("/dev/shm")
UID = os.getuid()
MiB = 2**20

MOUNTINFO = textwrap.dedent(
    r"""
    22 27 0:21 / /proc rw,relatime - proc proc rw
    24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334432k
    25 24 0:23 / /dev/shm rw,relatime shared:5 - tmpfs tmpfs rw,size=24683652k
    27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
    40 27 259:1 / /mnt/fast\040disk rw,relatime shared:7 master:2 - xfs /dev/nvme0n1p1 rw
    41 27 0:40 / /mnt/fast\040disk/scratch rw - tmpfs none rw,size=1g
    42 27 0:41 / /mnt/ram rw - ramfs ramfs rw
    43 27 252:0 / /mnt/zram rw - ext4 /dev/zram0 rw
    44 27 0:23 / /dev/shm rw,relatime - ext4 /dev/vdb rw
    not a mountinfo line
    """
).lstrip()


@pytest.fixture
def mountinfo(tmp_path) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


# --- (1) memory-backed "NVMe" ------------------------------------------------------------------------------


def test_mountinfo_parsing_unescapes_spaces_and_skips_optional_fields():
    mounts = parse_mountinfo(MOUNTINFO.encode())
    assert len(mounts) == 9  # the line that is not a mount is skipped
    fast = mounts[4]
    assert (fast.mount_point, fast.fstype, fast.source) == ("/mnt/fast disk", "xfs", "/dev/nvme0n1p1")
    assert (mounts[2].mount_point, mounts[2].fstype) == ("/dev/shm", "tmpfs")


@pytest.mark.parametrize(
    ("path", "mount_point", "fstype", "in_memory"),
    [
        ("/mnt/fast disk/swap", "/mnt/fast disk", "xfs", False),
        ("/mnt/fast disk", "/mnt/fast disk", "xfs", False),
        ("/mnt/fast diskette", "/", "ext4", False),  # a longer name is not inside the mount point
        ("/mnt/fast disk/scratch/swap", "/mnt/fast disk/scratch", "tmpfs", True),  # the longest prefix wins
        ("/mnt/ram/x", "/mnt/ram", "ramfs", True),
        ("/mnt/zram/x", "/mnt/zram", "ext4", True),  # ext4 on a compressed RAM drive
        ("/dev/null", "/dev", "devtmpfs", True),
        ("/dev/shm/x", "/dev/shm", "ext4", False),  # of two mounts on one point, the later (on top) counts
        ("/proc/1", "/proc", "proc", False),
        ("/home/me", "/", "ext4", False),
    ],
)
def test_the_mount_under_a_path(mountinfo, path, mount_point, fstype, in_memory):
    mount = mount_of(path, mountinfo)
    assert (mount.mount_point, mount.fstype) == (mount_point, fstype)
    assert (memory_backed_mount(path, mountinfo) is not None) == in_memory


def test_unreadable_mountinfo_refuses_nothing(tmp_path):
    assert mount_of("/dev/shm", str(tmp_path / "missing")) is None
    assert memory_backed_mount("/dev/shm", str(tmp_path / "missing")) is None


@pytest.fixture
def shm_folder():
    if memory_backed_mount(SHM) is None:
        pytest.skip("/dev/shm is not a tmpfs here")
    with tempfile.TemporaryDirectory(dir=SHM) as folder:
        yield folder


def test_nvme_path_on_tmpfs_is_refused(shm_folder):
    for path in ("/dev/shm", shm_folder, f"{shm_folder}/../{Path(shm_folder).name}"):
        with pytest.raises(UserInputError) as refused:
            inspect_nvme(path)
        message = str(refused.value)
        assert message.startswith(f"--nvme-path {path} is on tmpfs mounted at /dev/shm, which lives in RAM")
        assert "a folder on a real drive" in message and "--offload-optimizer cpu / --offload-param cpu" in message
        assert "\n" not in message
    with pytest.raises(UserInputError, match="on tmpfs"):
        inspect_host(shm_folder)  # what the planner calls for this machine


def test_cli_refuses_dev_shm_as_nvme_before_any_plan(tiny_llama_dir, shm_folder):
    args = ("--model", str(tiny_llama_dir), "--zero-stage", "3", "--offload-optimizer", "nvme")
    result = offload_launch(*args, "--nvme-path", "/dev/shm", "--dry-run")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no planning output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --nvme-path /dev/shm is on tmpfs"), result.stderr
    # A described host is another machine: its folder cannot be looked at from here, so it is not refused.
    described = CliRunner().invoke(
        cli_group, [*args, "--host-spec", "1x-a100-80g", "--nvme-path", "/dev/shm", "--dry-run"]
    )
    assert described.exit_code == 0, described.output
    assert '"nvme_path": "/dev/shm' in described.output


# --- (2) allreduce buffers killed runs left in /dev/shm -----------------------------------------------------


def buffer(folder: Path, rank: int, port: int = 29500, uid: int = UID, size: int = MiB) -> Path:
    path = folder / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_{rank}"
    path.write_bytes(b"\1" * size)  # real pages, as shm.cpp's write() of the whole workspace
    return path


HOLDER = textwrap.dedent(
    """
    import mmap, os, sys
    how, path = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_RDWR)
    if how == "map":  # as shm.cpp's shared_open: map it, then close nothing
        view = mmap.mmap(fd, 0)
        os.close(fd)  # the mapping alone keeps it
    print("ready", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def holder():
    """Start a live process that maps ("map") or only holds open ("open") a file; ended at teardown."""
    children = []

    def start(how: str, path: Path) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, how, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout.readline().strip() == "ready"
        return child

    yield start
    for child in children:
        child.stdin.close()
        child.wait(timeout=30)


def test_buffers_whose_owners_are_gone_are_removed_live_ones_never(tmp_path, holder):
    left = [buffer(tmp_path, 0, size=3 * MiB), buffer(tmp_path, 1, size=2 * MiB)]
    mapped, opened = buffer(tmp_path, 0, port=29501), buffer(tmp_path, 1, port=29501)
    holder("map", mapped)
    holder("open", opened)
    others = [
        buffer(tmp_path, 0, uid=UID + 1),  # another user's name
        tmp_path / "deepspeed_allreduce_buffer_x",  # not shm.cpp's name
        tmp_path / "psm_1234",
    ]
    for other in others[1:]:
        other.write_bytes(b"\1" * 4096)

    found = launch.orphaned_shm_buffers(tmp_path)
    assert [b.path for b in found] == left
    assert [b.bytes for b in found] == [3 * MiB, 2 * MiB]
    assert all(path.exists() for path in left)  # finding removes nothing

    removed = launch.remove_orphaned_shm_buffers(tmp_path)
    assert [b.path for b in removed] == left and sum(b.bytes for b in removed) == 5 * MiB
    assert not any(path.exists() for path in left)
    assert mapped.exists() and opened.exists() and all(path.exists() for path in others)
    assert launch.remove_orphaned_shm_buffers(tmp_path) == []


def test_a_buffer_is_freed_once_its_last_owner_exits(tmp_path, holder):
    path = buffer(tmp_path, 0)
    child = holder("map", path)
    assert launch.remove_orphaned_shm_buffers(tmp_path) == []
    child.stdin.close()
    child.wait(timeout=30)
    assert [b.path for b in launch.remove_orphaned_shm_buffers(tmp_path)] == [path]


def fake_proc(root: Path, pid: int, *, maps: str = "", status_uid: int = UID, cmdline: bytes = b"python\0") -> Path:
    pid_dir = root / str(pid)
    (pid_dir / "fd").mkdir(parents=True)
    (pid_dir / "maps").write_text(maps)
    (pid_dir / "status").write_text(f"Name:\tx\nUid:\t{status_uid}\t{status_uid}\t{status_uid}\t{status_uid}\n")
    (pid_dir / "cmdline").write_bytes(cmdline)
    return pid_dir


def unreadable(pid_dir: Path) -> None:
    """maps that cannot be read (a directory stands in for a permission error, which root would not get)."""
    (pid_dir / "maps").unlink()
    (pid_dir / "maps").mkdir()


def test_a_mapping_of_a_deleted_or_renamed_path_still_counts(tmp_path):
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    kept = buffer(shm, 0)
    line = f"7f00-7f10 rw-s 00000000 00:1a 999999 /dev/shm/{kept.name} (deleted)\n"  # another inode, same name
    fake_proc(proc, 10, maps=line)
    assert launch.orphaned_shm_buffers(shm, proc) == []


def test_a_process_that_cannot_be_read_and_may_be_a_rank_blocks_removal(tmp_path):
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    left = buffer(shm, 0)
    unreadable(fake_proc(proc, 10, cmdline=b"ssh-agent\0"))  # this user's, but not Python: cannot hold it
    unreadable(fake_proc(proc, 11, status_uid=UID + 1, cmdline=b"python\0"))  # another user's
    assert [b.path for b in launch.orphaned_shm_buffers(shm, proc)] == [left]
    unreadable(fake_proc(proc, 12, cmdline=b"/usr/bin/python3\0-m\0launcher.rank\0"))
    assert launch.orphaned_shm_buffers(shm, proc) == []
    assert launch.remove_orphaned_shm_buffers(shm, proc) == [] and left.exists()


@pytest.fixture
def plan(tiny_llama_dir):
    return make_plan(
        inspect_model(str(tiny_llama_dir)),
        (h := inspect_host()),
        Workload(num_gpus=2, seq_len=64),
        resolve_rates(h),
    )


def test_a_real_run_frees_them_a_dry_run_only_says_so(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "SHM_PATH", str(tmp_path))
    left = [buffer(tmp_path, rank, size=66 * MiB) for rank in (0, 1)]
    said: list[str] = []
    preflight.enforce(plan, None, fatal=False, warn=said.append)
    assert said[0] == (
        f"warning: {tmp_path} holds 132.0 MiB in 2 DeepSpeed allreduce buffers left by killed runs (owners gone); "
        "a real run removes them"
    )
    assert all(path.exists() for path in left)

    said.clear()
    preflight.enforce(plan, None, fatal=True, warn=said.append)
    assert said == [f"freed 132.0 MiB of {tmp_path}: 2 DeepSpeed allreduce buffers left by killed runs (owners gone)"]
    assert not any(path.exists() for path in left)
    said.clear()
    preflight.enforce(plan, None, fatal=True, warn=said.append)
    assert said == []  # nothing left: nothing said


def test_the_shm_check_sees_the_freed_room(plan, tmp_path, monkeypatch):
    """A 64 MiB tmpfs as /dev/shm, 48 MiB of it held by a killed run: 2 ranks needing 32 MiB fit once it is freed."""
    shm = tmp_path / "shm"
    shm.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        monkeypatch.setattr(preflight, "SHM_PATH", str(shm))
        monkeypatch.setattr(preflight, "SHM_BYTES_PER_CPU_RANK", 16 * MiB)
        buffer(shm, 0, size=48 * MiB)
        assert any(p.check == "shm" for p in preflight.find_problems(plan))
        said: list[str] = []
        preflight.enforce(plan, None, fatal=True, warn=said.append)  # no Stopped: the check ran after the cleanup
        assert said == [f"freed 48.0 MiB of {shm}: 1 DeepSpeed allreduce buffer left by killed runs (owners gone)"]
    finally:
        subprocess.run(["umount", "-l", str(shm)], check=False)


def test_a_described_hosts_dry_run_says_nothing_about_this_machine(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "SHM_PATH", str(tmp_path))
    buffer(tmp_path, 0)
    said: list[str] = []
    preflight.enforce(replace(plan, host=replace(plan.host, source="host.yaml")), None, fatal=False, warn=said.append)
    assert said == []
