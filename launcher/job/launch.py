"""Start DeepSpeed's own launcher on the per-rank entry point (`launcher.rank`).

`build_command()` is pure - (argv, env) from a LaunchSpec, asserted on by the tests and printed by
`--dry-run`; `run()` is the only place a process starts: it owns the process group, forwards Ctrl-C and
SIGTERM to every rank, and returns the exit code.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher import stops
from launcher.inspection.cuda_devices import RANK_DEVICES_ENV
from launcher.job import supervise
from launcher.job.sbatch import RANK_SCRIPT

ENTRY_MODULE = "launcher.rank"
STOP_GRACE_SECONDS = 30
# After a hard kill of this process (job/supervise.py): the ranks' SIGTERM, then SIGKILL this much later
ORPHAN_GRACE_SECONDS = 5.0
TIMEOUT_EXIT = 124  # as coreutils' timeout(1)


@dataclass(frozen=True)
class LaunchSpec:
    run_spec_path: str  # OUT/run_spec.json, read by every rank
    ranks_per_node: int
    accelerator: str  # "cuda" | "cpu"
    cpu_cores: int  # per node
    master_port: int
    hostfile: str | None = None
    launcher: str = "pdsh"
    master_addr: str | None = None
    bind_cores: bool = False  # DeepSpeed's --bind_cores_to_rank (binding.core_binding decides)
    # DeepSpeed's --bind_core_list: the cores to share out when they are not DeepSpeed's default, the first
    # psutil.cpu_count(logical=False) CPUs (an affinity mask, a cpuset, a CFS quota: binding.bind_core_list)
    bind_core_list: str | None = None
    extra_args: tuple[str, ...] = ()  # after `--`, for DeepSpeed's launcher
    python: str = sys.executable
    # The GPUs to put the ranks on (CUDA_VISIBLE_DEVICES, resolved to indices), one per rank; None: DeepSpeed's
    # default, GPUs 0..ranks_per_node-1. Used for single-node CUDA runs only.
    devices: tuple[int, ...] | None = None
    pci_bus_order: bool = False  # `devices` are NVML (PCI bus) indices: the ranks get CUDA_DEVICE_ORDER=PCI_BUS_ID
    # The MIG instance (MIG-UUID) the rank's CUDA_VISIBLE_DEVICES must name (cuda_devices.rank_devices): `devices`
    # then holds its GPU's index, which alone would give the rank that GPU's first instance
    rank_devices: str | None = None
    # PYTORCH_ALLOC_CONF for the ranks (the plan's alloc_conf, host_buffers.pinned_alloc_conf): None sets nothing
    alloc_conf: str | None = None
    # With a hostfile, OUT/deepspeed_env: the file DeepSpeed's runner reads (DS_ENV_FILE) to give every node's ranks
    # the variables below (job/nodes.py); pdsh forwards only a few prefixes of the launching node's environment
    env_file: str | None = None

    @property
    def threads_per_rank(self) -> int:
        """Each rank gets an equal share of the node's cores for torch and CPU-Adam (OMP_NUM_THREADS). Bound
        ranks get the same figure from DeepSpeed: its launch.py sets OMP_NUM_THREADS to the share it binds,
        psutil.cpu_count(logical=False) // ranks (deepspeed/utils/numa.py), which is cpu_cores // ranks for a
        host probed live (inspection/host.py counts its cores the same way)."""
        return max(1, self.cpu_cores // self.ranks_per_node)


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def build_command(spec: LaunchSpec) -> tuple[list[str], dict[str, str]]:
    """(argv, environment additions) for `python -m deepspeed.launcher.runner ... --module launcher.rank`."""
    include = spec.devices is not None and spec.accelerator == "cuda" and not spec.hostfile
    slurm = bool(spec.hostfile) and spec.launcher == "slurm"
    argv = [spec.python, "-m", "deepspeed.launcher.runner"]
    argv += _device_args(spec, include, slurm)
    argv += _runner_args(spec, slurm)
    return argv, _rank_env(spec, include, slurm)


def _device_args(spec: LaunchSpec, include: bool, slurm: bool) -> list[str]:
    """The runner's arguments that pick the nodes and devices: the hostfile, `--include` (`include`: the spec's
    own devices on one CUDA node) or the ranks per node."""
    # How DeepSpeed 0.19.8's runner (deepspeed/launcher/runner.py, main()) picks the devices:
    #     # respect VISIBLE_DEVICES for a single node and no explicit resource filters
    #     visible_devices = os.environ.get(visible_devices_env, "")
    #     if not resource_pool and len(visible_devices):
    #         if len(args.include) or len(args.exclude) or args.num_nodes > 1 or args.num_gpus > 0:
    #             print(f"{detected_str} but ignoring it because one or several of --include/--exclude/--num_gpus/...")
    #         else:
    #             args.include = f"localhost:{visible_devices}"
    #         del os.environ[visible_devices_env]
    # and then `if args.num_gpus > 0: updated_active_resources[hostname] = list(range(num_gpus))` (in
    # apply_num_nodes_and_gpus), so `--num_gpus N` drops the user's CUDA_VISIBLE_DEVICES and puts the ranks on
    # GPUs 0..N-1; deepspeed/launcher/launch.py then gives every rank CUDA_VISIBLE_DEVICES=<those ids>
    # (`get_accelerator().set_visible_devices_envs(current_env, local_accelerator_ids)`). The selection is kept
    # by naming it: `--include localhost:IDS` (ids are ints: `slots = [int(x) for x in slots.split(SLOT_SEP)]`,
    # each checked against range(device_count)), and without --num_gpus/--num_nodes, which the runner refuses
    # beside it: `if args.num_nodes >= 0 or args.num_gpus >= 0: if args.include != "" or args.exclude != "":
    # raise ValueError("Cannot specify num_nodes/gpus with include/exclude")` (both default to -1).
    # With a hostfile the branch above is skipped (`not resource_pool` is false): the devices are each host's
    # `slots=N`, i.e. 0..N-1 trimmed by --num_gpus, or the user's own --include/--exclude HOST:SLOTS (passed
    # through extra_args); this machine's CUDA_VISIBLE_DEVICES is not exported to the hosts (only
    # EXPORT_ENVS and the accelerator's export_envs() are) and launch.py overrides it on each of them.
    # --force_multi only forces that multi-node path (pdsh/ssh) for one host; it selects no devices.
    if not spec.hostfile:
        if include:
            return ["--include", "localhost:" + ",".join(map(str, spec.devices))]
        return ["--num_nodes", "1", "--num_gpus", str(spec.ranks_per_node)]
    argv = ["--hostfile", spec.hostfile, "--launcher", spec.launcher]
    # SlurmRunner.get_cmd: `if self.args.num_gpus > 0: srun_cmd.append('--gpus-per-node')`, which a node
    # without GPUs refuses; on the CPU accelerator the hostfile's slots are the ranks per node
    if not (slurm and spec.accelerator == "cpu"):
        argv += ["--num_gpus", str(spec.ranks_per_node)]
    # pdsh: every host was checked the way pdsh reaches it (nodes.check_ssh); srun reaches them without ssh
    if spec.launcher in ("pdsh", "slurm"):
        argv += ["--no_ssh_check"]
    return argv


def _runner_args(spec: LaunchSpec, slurm: bool) -> list[str]:
    """The runner's arguments after the devices: the rendezvous, core binding, the user's own, and the entry."""
    argv = ["--master_port", str(spec.master_port)]
    if spec.master_addr:
        argv += ["--master_addr", spec.master_addr]
    if spec.bind_cores:
        # deepspeed/launcher/launch.py: each rank starts under `numactl [-m NODE] -C FIRST-LAST` (its consecutive
        # share of the first psutil.cpu_count(logical=False) cores, or of --bind_core_list given after `--`),
        # with OMP_NUM_THREADS set to that share, over the one in `env` below
        argv += ["--bind_cores_to_rank"]
        if spec.bind_core_list:
            argv += ["--bind_core_list", spec.bind_core_list]
    argv += list(spec.extra_args)
    # SlurmRunner runs `srun ... python -u <user_script> <user_args>`: it drops --module and sets none of
    # torch.distributed's variables, so its script is sbatch.py, which sets them from srun's and runs launcher.rank
    entry = [RANK_SCRIPT] if slurm else ["--module", ENTRY_MODULE]
    return [*argv, "--no_local_rank", *entry, "--run-spec", spec.run_spec_path]


def _rank_env(spec: LaunchSpec, include: bool, slurm: bool) -> dict[str, str]:
    """The environment additions the ranks start with."""
    env = {
        "OMP_NUM_THREADS": str(spec.threads_per_rank),
        "TOKENIZERS_PARALLELISM": "false",  # ranks are already parallel; avoids fork warnings
        "PYTHONUNBUFFERED": "1",
    }
    if spec.accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    if include and spec.pci_bus_order:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the ranks' CUDA numbers GPUs as NVML did
    if include and spec.rank_devices:
        env[RANK_DEVICES_ENV] = spec.rank_devices
    if spec.alloc_conf:
        # torch's caching host allocator rounds pinned buffers up to a power of two unless told otherwise
        # (host_buffers.PINNED_ALLOC_CONF); the plan's CPU estimate counts the rounding this setting leaves
        env["PYTORCH_ALLOC_CONF"] = spec.alloc_conf
    if slurm:
        # srun's tasks get the runner's environment (--export=ALL), not its --master_addr / --master_port
        env["MASTER_PORT"] = str(spec.master_port)
        if spec.master_addr:
            env["MASTER_ADDR"] = spec.master_addr
    if spec.hostfile and spec.env_file:
        env["DS_ENV_FILE"] = spec.env_file  # an absolute path: the runner's os.path.join(~ or ., it) is the path
    return env


def format_command(argv: list[str], env: dict[str, str]) -> str:
    """The exact shell line `--dry-run` prints."""
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"{assignments} {shlex.join(argv)}"


@dataclass
class _Forwarder:
    """Forwards SIGINT/SIGTERM to the launcher's process group; a second signal kills it outright."""

    process: subprocess.Popen
    received: list[int] = field(default_factory=list)

    def __call__(self, signum, _frame) -> None:
        self.received.append(signum)
        sig = signal.SIGTERM if len(self.received) == 1 else signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)


def run(
    argv: list[str],
    env: dict[str, str],
    base_env: dict[str, str],
    *,
    timeout: float | None = None,
    stdout_to_stderr: bool = False,
    inherit_fds: tuple[int, ...] = (),
) -> int:
    """Start the launcher in its own process group and wait. Ctrl-C / SIGTERM stop every rank; so does
    `timeout` (seconds), after which the exit code is TIMEOUT_EXIT. `stdout_to_stderr` keeps the ranks'
    output off stdout (for --json, whose stdout is one object). `inherit_fds` stay open in the launcher: the
    output folder's lock, so that it is held as long as DeepSpeed's runner lives. The group's leader is
    job/supervise.py: if this process is killed outright, it stops the runner and the ranks within
    ORPHAN_GRACE_SECONDS, and the lock is free."""
    stops.honour()  # a stop swallowed by a finalizer on the way here: never start the ranks after it
    if "--include" in argv:
        # The devices are named in --include: DeepSpeed's runner would only print that it ignores
        # CUDA_VISIBLE_DEVICES, delete it, and count the GPUs (to check the ids) with it still read by CUDA.
        base_env = {k: v for k, v in base_env.items() if k != "CUDA_VISIBLE_DEVICES"}
    process = subprocess.Popen(
        supervise.command(os.getpid(), ORPHAN_GRACE_SECONDS, inherit_fds, argv),  # nothing outlives this process
        env={**base_env, **env},
        start_new_session=True,
        stdout=sys.stderr if stdout_to_stderr else None,
        pass_fds=inherit_fds,
    )
    forwarder = _Forwarder(process)
    previous = {sig: signal.signal(sig, forwarder) for sig in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    grace_ends = None  # when the first signal (or the time bound) has waited long enough for SIGTERM
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(timeout=1.0)  # short slices: a signal handled meanwhile is seen at once
                break
            now = time.monotonic()
            if deadline is not None and not forwarder.received and now >= deadline:
                timed_out = True  # the time bound ran out: stop every rank as Ctrl-C would
                forwarder(signal.SIGTERM, None)
            if forwarder.received and grace_ends is None:
                grace_ends = now + STOP_GRACE_SECONDS
            if grace_ends is not None and now >= grace_ends:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # No rank outlives the launcher (DeepSpeed's runner can exit before its children on errors).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        remove_shm_buffers(argv)
    if timed_out:
        return TIMEOUT_EXIT
    if forwarder.received:
        return 128 + forwarder.received[0]
    return code if code >= 0 else 128 - code


SHM_DIR = Path("/dev/shm")
SHM_BUFFER_PREFIX = "deepspeed_allreduce_buffer"  # shm.cpp's SHM_BUFFER_NAME
PROC = Path("/proc")


def remove_shm_buffers(argv: list[str]) -> list[Path]:
    """Remove the shared-memory allreduce buffers this run's ranks left on this machine. DeepSpeed's CPU
    communication (csrc/cpu/comm/shm.cpp) maps one 66 MiB file per rank, named
    deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>, and never unlinks it: every run on the CPU
    accelerator leaked 66 MiB of RAM per rank (/dev/shm is memory) until the test suite ran out of it."""
    if "--master_port" not in argv:
        return []
    port = argv[argv.index("--master_port") + 1]
    removed = []
    for buffer in SHM_DIR.glob(f"{SHM_BUFFER_PREFIX}_{os.getuid()}_*_{port}_*"):
        with contextlib.suppress(OSError):
            buffer.unlink()
            removed.append(buffer)
    return removed


@dataclass(frozen=True)
class ShmBuffer:
    path: Path
    bytes: int  # the memory it holds (allocated blocks, not the nominal size)
    mtime_ns: int


def _own_buffers(shm_dir: Path) -> list[ShmBuffer]:
    """This user's DeepSpeed allreduce buffers in `shm_dir`: the name shm.cpp gives them (with this uid) and
    this user as owner, regular files only."""
    uid = os.getuid()
    pattern = re.compile(rf"{SHM_BUFFER_PREFIX}_{uid}_.+_\d+_\d+")
    found = []
    for path in sorted(shm_dir.glob(f"{SHM_BUFFER_PREFIX}_{uid}_*")):
        try:
            st = path.lstat()
        except OSError:
            continue
        if pattern.fullmatch(path.name) and st.st_uid == uid and path.is_file() and not path.is_symlink():
            found.append(ShmBuffer(path, st.st_blocks * 512, st.st_mtime_ns))
    return found


def _may_run_deepspeed(pid_dir: Path, uid: int) -> bool:
    """A process whose maps and open files cannot be read (it turned off dumping, as ssh-agent does): could it
    hold this user's buffers? Only if it runs as this user and is a Python / DeepSpeed process (the buffers
    are made and mapped by shm.cpp inside a rank). Its status and cmdline stay readable."""
    try:
        status = (pid_dir / "status").read_text()
        cmdline = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return False  # gone, or hidden from this user
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
    return str(uid) in uids and any(word in cmdline for word in (b"python", b"deepspeed", b"launcher.rank"))


def _held(buffers: list[ShmBuffer], proc: Path) -> set[Path] | None:
    """The buffers some live process maps (/proc/<pid>/maps) or holds open (/proc/<pid>/fd), matched by device
    and inode and, as a second net, by name. None when a process that might hold them cannot be read: then
    nothing can be proven left behind."""
    wanted = {}
    for buffer in buffers:
        st = buffer.path.stat()
        wanted[(st.st_dev, st.st_ino)] = buffer.path
    names = {buffer.path.name: buffer.path for buffer in buffers}
    held: set[Path] = set()
    uid = os.getuid()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            maps = (pid_dir / "maps").read_text(errors="replace")
            fds = list((pid_dir / "fd").iterdir())
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            if _may_run_deepspeed(pid_dir, uid):
                return None
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) < 5 or fields[4] == "0":
                continue
            major, _, minor = fields[3].partition(":")
            try:
                key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
            except ValueError:
                key = None
            if key in wanted:
                held.add(wanted[key])
            name = fields[5].removesuffix(" (deleted)").rsplit("/", 1)[-1] if len(fields) > 5 else ""
            if name in names:
                held.add(names[name])
        for fd in fds:
            try:
                target = os.readlink(fd)
                # only DeepSpeed's files are followed: a stat through the link could hang on a dead NFS mount
                st = fd.stat() if SHM_BUFFER_PREFIX in target else None
            except OSError:
                continue
            if st is not None and (st.st_dev, st.st_ino) in wanted:
                held.add(wanted[(st.st_dev, st.st_ino)])
            name = target.removesuffix(" (deleted)").rsplit("/", 1)[-1]
            if name in names:
                held.add(names[name])
    return held


def orphaned_shm_buffers(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> list[ShmBuffer]:
    """This user's DeepSpeed allreduce buffers in `shm_dir` whose owners are gone: no live process maps them or
    holds them open. A rank keeps its own buffer's descriptor open and maps every rank's buffer for its whole
    life, so a buffer nobody holds belongs to a run that was killed before its launcher could remove it."""
    buffers = _own_buffers(shm_dir)
    if not buffers:
        return []
    try:
        held = _held(buffers, proc)
    except OSError:
        return []  # a buffer vanished meanwhile (another launcher cleaned up): look again next time
    if held is None:
        return []
    return [buffer for buffer in buffers if buffer.path not in held]


def remove_orphaned_shm_buffers(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> list[ShmBuffer]:
    """Remove the buffers killed runs left (`orphaned_shm_buffers`); what was removed. A buffer changed since it
    was looked at (a new run reusing the same name) is kept."""
    removed = []
    for buffer in orphaned_shm_buffers(shm_dir, proc):
        with contextlib.suppress(OSError):
            if buffer.path.lstat().st_mtime_ns != buffer.mtime_ns:
                continue
            buffer.path.unlink()
            removed.append(buffer)
    return removed
