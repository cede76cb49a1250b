"""Writing files so that a crash leaves the old version or the new one, never half of one; appending JSON
lines; sizing folders."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    """Write to a temporary file of this process, fsync, rename over `path` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict) -> None:
    """Add one JSON line to `path` (created when missing), on disk before this returns: a run killed right
    after keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def folder_bytes(folder: str | Path | None) -> int:
    """Bytes in the files under `folder` (0 when it is None or not a folder)."""
    if not folder or not Path(folder).is_dir():
        return 0
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def tool_cache_dir() -> Path:
    """$XDG_CACHE_HOME/offload-launch (default ~/.cache/offload-launch): probe figures, model profiles, and the
    fingerprints of configs DeepSpeed already accepted."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offload-launch"
