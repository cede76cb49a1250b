"""The output folder of a run: whose it is, who is using it, and what it may delete.

OUT/offload-launch.json  the folder's marker (below)      OUT/metrics.jsonl  one line per optimizer step
OUT/.offload-launch.lock held by the run using OUT        OUT/run.json       summary: predicted vs measured
OUT/plan.json            the plan (the --json contract)   OUT/checkpoints/   step<N>/ + complete.json
OUT/ds_config.json       what DeepSpeed reads             OUT/final/         save_pretrained + tokenizer
OUT/run_spec.json        what every rank reads            OUT/cache/         tokenized, packed data
OUT/ranks/               where each rank ran, how it ended (job/ranks.py)
OUT/final-merged/        with --lora --merge: the base with the adapter merged in
(a smoke test's folder: OUT/smoke.json, OUT/smoke-model/, OUT/smoke-checkpoint/; `report`: OUT/report.png)

Ownership. The marker says the folder is this tool's and records what wrote it: the run's identity (model,
data fingerprint, workload, strategy) and the names the tool made. Only the names in TOOL_NAMES are ever
written, and only those the marker lists as made are ever deleted: a user's own files beside them are never
touched. A non-empty folder without the marker is refused unless --force, and --force still refuses one
where a name the tool writes already holds somebody else's files.

One run at a time. A run holds an exclusive lock (flock on OUT/.offload-launch.lock) from its first write to
its end; the kernel drops it when the holder exits however it exits, so a dead holder never blocks anyone.

Resume: resume.py compares the run about to start with the one that wrote the checkpoints.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import UserInputError
from launcher.files import write_json_atomic

MARKER_FILE = "offload-launch.json"
LOCK_FILE = ".offload-launch.lock"
MARKER_VERSION = 1
METRICS_FILE = "metrics.jsonl"  # one line per optimizer step
SUMMARY_FILE = "run.json"  # written last by a finished training run
# a training run's results: --no-resume drops them ("final-merged": a LoRA's --merge)
RESULT_NAMES = (METRICS_FILE, SUMMARY_FILE, "checkpoints", "final", "final-merged")
# rewritten by every run; deepspeed_env (job/nodes.py ENV_FILE) only with --hostfile
CONFIG_NAMES = ("plan.json", "ds_config.json", "run_spec.json", "deepspeed_env", "ranks")
SMOKE_RESULT, SMOKE_MODEL, SMOKE_CHECKPOINT = "smoke.json", "smoke-model", "smoke-checkpoint"  # a smoke test's
SMOKE_NAMES = (SMOKE_RESULT, SMOKE_MODEL, SMOKE_CHECKPOINT)
REPORT_FILE = "report.png"  # `offload-launch report RUN` without --out
TOOL_NAMES = (MARKER_FILE, LOCK_FILE, *CONFIG_NAMES, *RESULT_NAMES, "cache", *SMOKE_NAMES, REPORT_FILE)
COMPLETE_MARKER = "complete.json"  # written last into a checkpoint: one without it is never resumed from
CHECKPOINT_TAG = re.compile(r"step(\d+)")  # the tool's checkpoint folders: checkpoints/step<N>
SHARED_CHECKPOINTS = "OUT/checkpoints"  # the run identity's "checkpoints" without --node-local-checkpoints
NODE_FOLDER = re.compile(r"node\d+")  # a node's folder of node-local checkpoints: <root>/node<N>
SWAP_PREFIX = "offload-launch-"  # every run's folder under --nvme-path starts with this
SWAP_OWNER_FILE = "owner.json"  # in that folder: which output folder's run it belongs to
_SHOWN = 4  # entries named in a message before "and N more"


def default_output_dir(model_name: str) -> str:
    return str(Path("runs") / Path(model_name.rstrip("/")).name)


def output_dir_of(settings) -> Path:
    """The run's output folder: --output-dir, else runs/<model>."""
    return Path(settings.output_dir or default_output_dir(settings.model))


def swap_dir(nvme_path: str, output_dir: str) -> str:
    """This run's own folder under --nvme-path: stable across resumes of the same OUT, distinct between
    runs, so two runs sharing a drive never overwrite each other's swap files (FIELD-NOTES)."""
    digest = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return str(Path(nvme_path) / f"{SWAP_PREFIX}{digest}")


def run_swap_dir(plan, output_dir: str | Path) -> str | None:
    """The run's own swap folder when its strategy swaps to NVMe (under --nvme-path, else the described
    host's nvme.path); None otherwise."""
    strategy = plan.chosen.strategy
    if "nvme" not in (strategy.offload_optimizer, strategy.offload_param):
        return None
    return swap_dir(plan.workload.nvme_path or plan.host.nvme.path, str(output_dir))


# ------------------------------------------------------------------------------------------- checkpoints


def complete_checkpoints(checkpoint_dir: Path) -> list[tuple[int, str]]:
    """(step, tag) of every checkpoint whose completion marker exists, oldest first."""
    found = []
    if checkpoint_dir.is_dir():
        for marker in checkpoint_dir.glob(f"*/{COMPLETE_MARKER}"):
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
                found.append((int(json.loads(marker.read_text())["step"]), marker.parent.name))
    return sorted(found)


def node_local_root(directory: str | None, output_dir: str | Path) -> str | None:
    """The run's own folder under --node-local-checkpoints DIR (as its swap folder under --nvme-path: stable across
    resumes of the same OUT, distinct between runs), absolute; each node keeps its ranks' checkpoints in node<N>
    under it. None without DIR: the checkpoints are OUT/checkpoints."""
    return swap_dir(str(Path(directory).resolve()), str(output_dir)) if directory else None


def newest_checkpoint_step(out: Path, node_local: str | None = None) -> int:
    """The step of OUT's newest complete checkpoint; 0 when there is none. With node-local checkpoints
    (`node_local`: node_local_root), the newest that every node folder seen from here has complete: on a shared
    disk every node's, on a node's own disk its own (the ranks agree on the rest: rank/checkpoints.py)."""
    if node_local is None:
        checkpoints = complete_checkpoints(Path(out) / "checkpoints")
        return checkpoints[-1][0] if checkpoints else 0
    root = Path(node_local)
    nodes = [p for p in root.glob("node*") if NODE_FOLDER.fullmatch(p.name)] if root.is_dir() else []
    steps = [{step for step, _tag in complete_checkpoints(node)} for node in nodes]
    return max(set.intersection(*steps), default=0) if steps else 0


def discard_incomplete(checkpoint_dir: Path, everything: bool = False) -> list[str]:
    """Remove the tool's checkpoint folders (step<N>) without a completion marker: a run stopped while writing
    them. They are never resumed from, and removing them gives their disk space back before the next save.
    `everything`: the complete ones too (--no-resume, where the ranks start node-local storage over)."""
    complete = set() if everything else {tag for _step, tag in complete_checkpoints(checkpoint_dir)}
    removed = []
    if checkpoint_dir.is_dir():
        for folder in sorted(checkpoint_dir.iterdir()):
            if folder.is_dir() and CHECKPOINT_TAG.fullmatch(folder.name) and folder.name not in complete:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
    return removed


# ------------------------------------------------------------------------------------------- the marker


def read_marker(out: Path) -> dict | None:
    """The folder's marker, or None when it has none (or one this tool cannot read: then it is not ours)."""
    try:
        marker = json.loads((Path(out) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("tool") == "offload-launch" else None


def _legacy_marker(out: Path) -> dict | None:
    """A run folder an earlier offload-launch wrote (no marker, but its run_spec.json names this folder): its
    tool names are the tool's; the identity of its run was not recorded."""
    try:
        spec = json.loads((out / "run_spec.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(spec, dict) or spec.get("output_dir") != str(out.resolve()):
        return None
    made = [name for name in TOOL_NAMES if (out / name).exists()]
    return new_marker("smoke" if spec.get("smoke") else "train", made, legacy=True)


def new_marker(kind: str, made: list[str] | None = None, *, legacy: bool = False) -> dict:
    return {
        "tool": "offload-launch",
        "version": MARKER_VERSION,
        "kind": kind,  # "train" | "smoke": what the folder was last used for
        "created": time.time(),
        "legacy": legacy,  # adopted from an earlier version that recorded no run identity
        "made": sorted(set(made or [])),  # the tool names this tool made here; only these are ever deleted
        "run": None,  # the identity of the run the checkpoints belong to (run_identity in job/prepare.py)
    }


def _entries(out: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in out.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise UserInputError(f"--output-dir {out} is a file, not a folder; pass a folder") from None
    except PermissionError:
        raise UserInputError(f"cannot read --output-dir {out} (permission denied); pass a folder you own") from None


def _free(out: Path, name: str) -> bool:
    """A tool name that holds nothing of anybody's: the lock file, or an empty folder (one made ready for the
    run, e.g. a mount point for OUT/checkpoints on another disk)."""
    path = out / name
    if name == LOCK_FILE:
        return True
    return name in TOOL_NAMES and path.is_dir() and not path.is_symlink() and not _entries(path)


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


@dataclass
class Ownership:
    """What check_folder found: the marker (None for a new or empty folder, or one taken with --force, whose
    marker the run writes when it claims it) and what to tell the user once the run goes ahead."""

    out: Path
    marker: dict | None
    messages: list[str] = field(default_factory=list)


def check_folder(out: Path, kind: str, force: bool) -> Ownership:
    """Whether a run of `kind` ("train" | "smoke") may use OUT. Reads only; raises UserInputError (exit 2)
    for a folder that holds somebody else's files (unless --force, which still refuses when a name the
    tool writes holds them), and for a smoke test over a training run (unless --force)."""
    out = Path(out)
    entries = [name for name in _entries(out) if name != LOCK_FILE and not _free(out, name)]
    marker = read_marker(out) or (_legacy_marker(out) if entries else None)
    if marker is None and entries:
        if not force:
            raise UserInputError(
                f"{out} is not empty and offload-launch did not make it (it holds {_named(entries)}); pass a new "
                "or empty --output-dir, or --force to run beside those files (offload-launch then writes and "
                "deletes only its own)"
            )
        taken = [name for name in entries if name in TOOL_NAMES]
        if taken:
            raise UserInputError(
                f"--force cannot use {out}: {_named(taken)} {'is a name' if len(taken) == 1 else 'are names'} "
                f"offload-launch writes, holding files it did not write; move {'it' if len(taken) == 1 else 'them'} "
                "or pass another --output-dir"
            )
        return Ownership(out, None, messages=[f"--force: running in {out} beside {_named(entries)}"])
    if marker is not None and kind == "smoke" and marker["kind"] == "train" and not force:
        raise UserInputError(
            f"{out} holds a training run, which a smoke test would erase; pass another --output-dir "
            "(the default is runs/<model>-smoke), or --force"
        )
    return Ownership(out, marker)


def write_marker(out: Path, marker: dict) -> None:
    write_json_atomic(Path(out) / MARKER_FILE, marker)


def claim(out: Path, kind: str, names: tuple[str, ...], found: dict | None = None) -> dict:
    """Mark OUT as this tool's (a new, empty or --force folder gets its marker now; `found`: the marker
    check_folder made for an earlier version's folder) and record `names` as made by it before they are
    written; the marker."""
    marker = read_marker(out) or found or new_marker(kind)
    entries = set(_entries(out))
    # a name already there that the marker does not list is somebody else's: never claimed, so never deleted
    claimed = [name for name in names if name in marker["made"] or name not in entries or _free(out, name)]
    marker = {**marker, "kind": kind, "made": sorted({*marker["made"], *claimed, MARKER_FILE})}
    write_marker(out, marker)
    return marker


def claim_name(out: Path, name: str) -> None:
    """Before a command other than a run writes `name` into OUT (`report`'s image): in a folder with the marker
    the name is recorded as made, and one that holds somebody else's file is refused."""
    marker = read_marker(out)
    if marker is None or name in marker["made"]:
        return
    if (Path(out) / name).exists():
        raise UserInputError(f"{Path(out) / name} was not written by offload-launch; pass --out with another file")
    write_marker(out, {**marker, "made": sorted({*marker["made"], name})})


def start_over(out: Path, names: tuple[str, ...] = RESULT_NAMES) -> list[str]:
    """--no-resume (and every smoke test): delete the previous run's `names` (by default its checkpoints,
    metrics, summary and export; never the data cache), but only those the marker lists as made by this
    tool. The names deleted."""
    marker = read_marker(out)
    made = set(marker["made"]) if marker else set()
    removed = []
    for name in names:
        if name not in made:
            continue
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(name)
    if marker is not None:
        write_marker(out, {**marker, "run": None})
    return removed


def leave_no_trace(out: Path, *, created: bool) -> None:
    """A run that stopped before it wrote anything but the marker (and an empty cache folder) takes those
    back, and OUT too when this run created it: a refused first run leaves the disk as it found it."""
    marker = read_marker(out)
    if marker is None or marker.get("run") is not None:
        return
    cache = Path(out) / "cache"
    if cache.is_dir() and not any(cache.iterdir()) and "cache" in marker["made"]:
        cache.rmdir()
    if set(_entries(out)) <= {MARKER_FILE, LOCK_FILE}:
        (Path(out) / MARKER_FILE).unlink(missing_ok=True)
        (Path(out) / LOCK_FILE).unlink(missing_ok=True)  # still held by the caller, who releases it next
        if created:
            with contextlib.suppress(OSError):
                Path(out).rmdir()


def record_run(out: Path, identity: dict) -> None:
    """The identity of the run that is about to write OUT's checkpoints (its steps updated on a resume)."""
    marker = read_marker(out)
    write_marker(out, {**marker, "run": identity, "legacy": False})


# ------------------------------------------------------------------------------------------- the lock


class FolderLock:
    """An exclusive lock on OUT for one run's life (flock on OUT/.offload-launch.lock). The kernel releases
    it when the holding process exits, however it exits: a dead holder's lock is never in the way. The file
    says who holds it, for the message the next run shows."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.path = self.out / LOCK_FILE
        self.fd: int | None = None
        self.created = False  # this lock made OUT

    def acquire(self) -> FolderLock:
        try:
            self.created = not self.out.exists()
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserInputError(
                f"cannot write to --output-dir {self.out} ({exc.strerror}); pass a writable folder"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserInputError(
                f"{self.out} is in use by another offload-launch run ({holder}); wait for it to finish, or pass "
                "another --output-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)  # nobody holds it now
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "argv": sys.argv}


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 65536, 0) or b"{}")
        started = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on {info['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder did not say who it is"
