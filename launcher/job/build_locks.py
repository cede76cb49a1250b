"""JIT-build locks a killed build left behind: found before anything waits on one, and cleared.

DeepSpeed compiles its ops (cpu_adam, async_io, shm_comm, ...) on first use through torch's
`cpp_extension.load`, which takes a file lock in the op's build folder (`torch/utils/file_baton.py`: `lock`, made
with O_CREAT | O_EXCL) and removes it when the build ends. A build killed mid-way (SIGKILL, the OOM killer, a CI
timeout) never removes it, and every later process that needs the op spins in `FileBaton.wait()` forever, printing
nothing: among DeepSpeed users' most reported hangs (the usual advice is to delete the folder by hand).

A lock is stale when no process works in its folder (ninja and the compilers run with the build folder as their
working directory: `cpp_extension._run_ninja_build`) and nothing in the folder changed for LOCK_GRACE_SECONDS (the
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


def folders_in_use(proc: Path = Path("/proc")) -> set[Path]:
    """The working directories of every process this user can see (a live build's ninja and compilers)."""
    found = set()
    for entry in proc.glob("[0-9]*"):
        try:
            found.add(Path(os.readlink(entry / "cwd")))
        except OSError:  # gone, or another user's
            continue
    return found


def stale_locks(roots: list[Path], *, now: float | None = None, in_use: set[Path] | None = None) -> list[Path]:
    """The build locks under `roots` that no live build holds (see the module's docstring)."""
    now = time.time() if now is None else now
    in_use = folders_in_use() if in_use is None else in_use
    stale = []
    for lock in sorted(lock for root in roots for lock in root.glob(f"*/{LOCK_NAME}")):
        try:  # the folder's newest change: a build elsewhere (a shared home folder, another node) writes there
            age = now - max(path.stat().st_mtime for path in (lock, *lock.parent.iterdir()))
        except OSError:  # released meanwhile
            continue
        folder = lock.parent.resolve()
        if age > LOCK_GRACE_SECONDS and not any(path == folder or folder in path.parents for path in in_use):
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
