"""JIT-build locks a killed build left behind: found before anything waits on one, and cleared.

DeepSpeed compiles its ops (cpu_adam, async_io, shm_comm, ...) on first use through torch's
`cpp_extension.load`, which takes a file lock in the op's build folder (`torch/utils/file_baton.py`: `lock`, made
with O_CREAT | O_EXCL) and removes it when the build ends. A build killed mid-way (SIGKILL, the OOM killer, a CI
timeout) never removes it, and every later process that needs the op spins in `FileBaton.wait()` forever, printing
nothing: among DeepSpeed users' most reported hangs (the usual advice is to delete the folder by hand).

A lock is stale when no build that will release it runs (ninja and the compilers work in the build folder,
`cpp_extension._run_ninja_build`, started by torch's builder from elsewhere: compilers orphaned by a killed builder
do not count, see live_build) and nothing in the folder changed for LOCK_GRACE_SECONDS (the
builder writes build.ninja for a moment before ninja starts; a build on another machine sharing the folder writes
its objects there). The op's whole folder goes, not only the lock: what the killed build
left half-written is compiled again (about a minute per op)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

LOCK_NAME = "lock"  # torch/utils/cpp_extension.py: FileBaton(os.path.join(build_directory, 'lock'))
LOCK_GRACE_SECONDS = 30.0


def extension_roots(environ: Mapping[str, str]) -> list[Path]:
    """The folders torch builds this interpreter's extensions in (cpp_extension._get_build_directory):
    $TORCH_EXTENSIONS_DIR itself, else ~/.cache/torch_extensions/py<XY>_<accelerator> (every accelerator's)."""
    if explicit := environ.get("TORCH_EXTENSIONS_DIR"):
        return [Path(explicit)]
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return sorted(cache.glob(f"{python}_*"))


def processes(proc: Path = Path("/proc")) -> dict[int, tuple[int, Path]]:
    """{pid: (parent pid, working directory)} of every process this user can see."""
    found = {}
    for entry in proc.glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(entry.name)] = (parent, Path(os.readlink(entry / "cwd")))
        except (OSError, ValueError, IndexError):  # gone, or another user's
            continue
    return found


def live_build(folder: Path, table: dict[int, tuple[int, Path]]) -> bool:
    """Whether a build that will release `folder`'s lock runs: a process working in the folder (ninja, the
    compilers) started, through others working there, by one that does not (torch's builder, which holds the
    lock). A compile whose builder was killed has been handed to PID 1: it may finish, but nobody releases the lock.
    """

    def inside(path: Path) -> bool:
        return path == folder or folder in path.parents

    for pid, (parent, cwd) in table.items():
        if not inside(cwd):
            continue
        seen = {pid}
        while parent in table and inside(table[parent][1]) and parent not in seen:
            seen.add(parent)
            parent = table[parent][0]
        if parent > 1:
            return True
    return False


def stale_locks(roots: list[Path], *, now: float | None = None, table: dict | None = None) -> list[Path]:
    """The build locks under `roots` that no live build holds (see the module's docstring); `table`: processes()."""
    now = time.time() if now is None else now
    table = processes() if table is None else table
    stale = []
    for lock in sorted(lock for root in roots for lock in root.glob(f"*/{LOCK_NAME}")):
        try:  # the folder's newest change: a build elsewhere (a shared home folder, another node) writes there
            age = now - max(path.stat().st_mtime for path in (lock, *lock.parent.iterdir()))
        except OSError:  # released meanwhile
            continue
        if age > LOCK_GRACE_SECONDS and not live_build(lock.parent.resolve(), table):
            stale.append(lock)
    return stale


def clear_stale_locks(environ: Mapping[str, str], *, remove: bool, warn: Callable[[str], None]) -> list[Path]:
    """Each stale build lock said in one line to `warn`: removed with its op's build folder (`remove`: a run about
    to build), or what to remove (a dry run). The locks found."""
    locks = stale_locks(extension_roots(environ))
    for lock in locks:
        folder, op = lock.parent, lock.parent.name
        if remove:
            shutil.rmtree(folder, ignore_errors=True)
            warn(
                f"removed {folder}: a build of DeepSpeed's {op} op was killed mid-way and left its lock, on which "
                "every later run would wait forever; it is compiled again (about a minute)"
            )
        else:
            warn(
                f"warning: {lock} is left by a killed build of DeepSpeed's {op} op: every run that needs the op "
                f"would wait on it forever; a real run removes {folder} (or: rm -r {folder})"
            )
    return locks
