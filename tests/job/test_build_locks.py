"""A JIT-build lock a killed build left (launcher/job/build_locks.py): found before anything waits on it, and
removed with its op's folder; a lock a live build holds, or a fresh one, is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from launcher.job import build_locks


def _lock(root, op: str, age_seconds: float):
    folder = root / op
    folder.mkdir(parents=True)
    (folder / "cpu_adam.o").write_bytes(b"half written")
    lock = folder / build_locks.LOCK_NAME
    lock.touch()
    then = time.time() - age_seconds
    for path in (lock, folder / "cpu_adam.o"):
        os.utime(path, (then, then))
    return lock


def test_the_extension_roots_follow_torch(tmp_path):
    assert build_locks.extension_roots({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == [tmp_path]
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    for folder in (f"{python}_cpu", f"{python}_cu128", "py27_cpu"):
        (tmp_path / "torch_extensions" / folder).mkdir(parents=True)
    roots = build_locks.extension_roots({"XDG_CACHE_HOME": str(tmp_path)})
    assert [r.name for r in roots] == [f"{python}_cpu", f"{python}_cu128"]  # this interpreter's only


def test_a_stale_lock_is_removed_with_its_folder_and_said_once(tmp_path):
    stale = _lock(tmp_path, "cpu_adam", age_seconds=600)
    fresh = _lock(tmp_path, "async_io", age_seconds=1)  # a builder writing build.ninja right now
    said: list[str] = []
    found = build_locks.clear_stale_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, remove=True, warn=said.append)
    assert found == [stale] and not stale.parent.exists() and fresh.exists()
    assert len(said) == 1 and "cpu_adam" in said[0] and "killed mid-way" in said[0]


def test_a_dry_run_says_what_to_remove_and_removes_nothing(tmp_path):
    stale = _lock(tmp_path, "shm_comm", age_seconds=600)
    said: list[str] = []
    build_locks.clear_stale_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, remove=False, warn=said.append)
    assert stale.exists() and said[0].startswith("warning: ") and f"rm -r {stale.parent}" in said[0]


def test_a_lock_a_live_build_holds_is_left_alone(tmp_path):
    """A process working in the op's folder (ninja, the compiler), started by a builder working elsewhere (torch's
    cpp_extension, which holds the lock), is a live build however old the lock."""
    lock = _lock(tmp_path, "cpu_adam", age_seconds=600)
    builder = subprocess.Popen(["sleep", "30"], cwd=lock.parent)  # its parent, this test, works elsewhere
    try:
        deadline = time.monotonic() + 5
        while builder.pid not in build_locks.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert build_locks.stale_locks([tmp_path]) == []
    finally:
        builder.kill()
        builder.wait()
    assert build_locks.stale_locks([tmp_path]) == [lock]  # the builder gone: now it is stale


def test_compilers_a_killed_builder_left_running_hold_no_lock(tmp_path):
    """The builder was killed (SIGKILL, a timeout) while ninja compiled: ninja and its compilers carry on, handed
    to PID 1, and may even finish, but nobody will release the lock: it is stale."""
    lock = _lock(tmp_path, "async_io", age_seconds=600)
    folder = lock.parent.resolve()
    elsewhere = tmp_path.resolve()
    orphaned = {500: (1, folder), 501: (500, folder), 502: (501, folder)}  # ninja <- sh <- cc1plus
    assert build_locks.stale_locks([tmp_path], table=orphaned) == [lock]
    building = {400: (1, elsewhere), 500: (400, folder), 501: (500, folder)}  # torch's builder <- ninja <- cc1plus
    assert build_locks.stale_locks([tmp_path], table=building) == []


def test_a_folder_still_written_to_is_a_live_build_elsewhere(tmp_path):
    """A home folder shared by several machines: a build on another node writes its objects there."""
    lock = _lock(tmp_path, "cpu_adam", age_seconds=600)
    (lock.parent / "adam.o").write_bytes(b"just compiled")
    assert build_locks.stale_locks([tmp_path], table={}) == []


def test_torch_would_wait_forever_on_it(tmp_path):
    """The hang itself, as torch meets it: FileBaton.try_acquire fails on a lock no build will ever release (a
    later run would spin in FileBaton.wait(), printing nothing)."""
    from torch.utils.file_baton import FileBaton

    lock = _lock(tmp_path, "cpu_adam", age_seconds=600)
    assert FileBaton(str(lock)).try_acquire() is False
    build_locks.clear_stale_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, remove=True, warn=lambda _line: None)
    lock.parent.mkdir()
    assert FileBaton(str(lock)).try_acquire() is True
