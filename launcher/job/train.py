"""The training workflow, in the steps the CLI shows between: plan and prepare (nothing started, nothing
written but the data cache), write the run folder, launch DeepSpeed's launcher and read the summary.

Prints nothing: messages meant for the user while it works go to the `warn` callback the caller passes,
problems are raised as domain errors (launcher/errors.py) carrying their exit code.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from launcher import stops
from launcher.config.final import UserConfig
from launcher.errors import Stopped, UserInputError
from launcher.job import binding, launch, nodes, preflight, prepare, ranks, rundir
from launcher.job.planning import hostfile_hosts
from launcher.job.prepare import Job
from launcher.job.resume import ResumeCheck, refusal, resume_changes
from launcher.plan.planner import Plan
from launcher.settings import Settings, declaration

Warn = Callable[[str], None]


@dataclass
class PreparedRun:
    plan: Plan
    job: Job | None  # None when nothing fits (the caller shows the plan and stops with exit 3)
    out: Path  # the run folder as the user named it (--output-dir, else runs/<model>)
    resume_from: int = 0  # the checkpoint step the run continues after (0: from the start)
    finished: bool = False  # every step is done and the export written: nothing to launch
    lock: rundir.FolderLock | None = None  # held from the first write to the end (None for a dry run)

    @property
    def command(self) -> str:
        return launch.format_command(self.job.argv, self.job.env)

    def __enter__(self) -> PreparedRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()


def output_dir(settings: Settings) -> Path:
    return rundir.output_dir_of(settings)


def newest_checkpoint_step(settings: Settings) -> int:
    """The newest complete checkpoint of this run folder, as far as this machine can see: in OUT/checkpoints, or
    with --node-local-checkpoints also there (a run that changed where its checkpoints go is told so by the resume
    check, instead of starting over beside them)."""
    out = output_dir(settings)
    root = rundir.node_local_root(settings.node_local_checkpoints, out)
    shared = rundir.newest_checkpoint_step(out)
    return max(shared, rundir.newest_checkpoint_step(out, root)) if root else shared


def prepare_run(
    plan: Plan,
    settings: Settings,
    *,
    user: UserConfig | None,
    launcher_args: tuple[str, ...],
    warn: Warn,
) -> PreparedRun:
    """Checks in the order that loses nothing, and writes nothing until they pass: whose the run folder is,
    the job (final config, data, tokenizer), whether the checkpoints there may be resumed, the host's limits
    (fatal unless --dry-run; the CUDA toolkit the final config's ops need among them);
    then a real run takes the folder's lock (use the result as a context manager: it holds the lock),
    tokenizes into OUT/cache and checks that the data is the checkpoint's."""
    out = output_dir(settings)
    if plan.chosen is None:
        return PreparedRun(plan, None, out)
    ownership = rundir.check_folder(out, "train", settings.force)
    binding.check_bind_cores(settings)  # typed without numactl: one line before anything is read
    swap = rundir.run_swap_dir(plan, out)
    folder = _Folder(out, ownership, settings, warn)

    def before_data(identity: dict, config: dict) -> None:
        """prepare() has made the final ds_config, read the data's first records and written nothing: whether
        the checkpoints may be resumed, then the host's checks (each refusal is one line; only a run that goes
        ahead frees the /dev/shm killed runs left, and says so), then the folder is taken."""
        folder.resume_check(identity)
        preflight.enforce(plan, swap, fatal=not settings.dry_run, warn=warn, config=config)
        if settings.hostfile and settings.launcher == "pdsh" and not settings.dry_run:
            nodes.check_ssh(settings.hostfile, launcher_args)  # every host, as pdsh will reach it
        folder.take()

    try:
        job = prepare.prepare(
            plan,
            settings,
            output_dir=out,
            user=user,
            launcher_args=launcher_args,
            tokenize=not settings.dry_run,
            before_data=before_data,
        )
        for line in (*job.warnings, *job.notes):
            warn(line)
        check = folder.resume_check(job.identity)
        for note in check.notes:
            warn(note)
    except BaseException:
        folder.give_back()
        raise
    finished = check.step == job.spec.steps and (out / rundir.SUMMARY_FILE).is_file()
    return PreparedRun(job.plan, job, out, check.step, finished, folder.lock)


# The settings the plan chooses when left at "auto" that a checkpoint fixes (run_identity's names and values).
KEPT_ON_RESUME = ("zero_stage", "offload_optimizer", "offload_param", "precision")


def keep_checkpoint_strategy(settings: Settings) -> tuple[Settings, str | None]:
    """A run that will resume OUT's newest complete checkpoint keeps that checkpoint's ZeRO stage, offload
    devices and precision wherever the user left them to the plan ("auto"): the plan may choose differently
    today (finished runs calibrate it, rates get measured, memory is freed), and a checkpoint resumes only under
    the strategy that wrote it (resume.resume_changes), so "rerun the same command" must mean the same strategy.
    A kept value that the other settings contradict is left to the resume check, which names what differs.
    Returns the settings and the line that says what was kept (the caller says it once the resume goes ahead)."""
    out = output_dir(settings)
    previous = (rundir.read_marker(out) or {}).get("run") if settings.resume else None
    if not previous or not (step := newest_checkpoint_step(settings)):
        return settings, None
    kept = {
        name: str(previous[name])
        for name in KEPT_ON_RESUME
        if getattr(settings, name) == "auto" and str(previous.get(name)) in declaration(name).choices
    }
    if not kept:
        return settings, None
    try:
        resumed = replace(settings, **kept)
    except UserInputError:
        return settings, None
    said = ", ".join(f"{declaration(name).flag} {value}" for name, value in kept.items())
    return resumed, f"resuming {out} after step {step}: keeping its checkpoint's {said} (--no-resume plans afresh)"


def needs_rates(plan: Plan, settings: Settings) -> bool:
    """Whether a real run should measure this host first (build_plan's `measure`): the plan is for this machine
    and some figure it ran on is not measured (the passes at this model's shapes, ZeRO's per-tensor cost, the NVMe
    folder it swaps to);
    and the run would get past its cheap checks (the output folder is the tool's, the data is there), so that a
    mistake is still said at once rather than after the measuring."""
    sources = plan.rates.sources
    uses_nvme = "nvme" in (plan.chosen.strategy.offload_optimizer, plan.chosen.strategy.offload_param)
    nvme_nominal = uses_nvme and str(sources.get("nvme_read_bytes_per_s")).startswith("nominal")
    zero_nominal = sources.get("zero_tensor_seconds") == "nominal"  # not tried yet on this host
    under_load = any(source == "measured under load" for source in sources.values())  # measure/contention.py
    measured = sources.get("passes") == "measured" and not (nvme_nominal or zero_nominal or under_load)
    if plan.host.source != "live" or measured:
        return False
    rundir.check_folder(output_dir(settings), "train", settings.force)
    return not settings.data or Path(settings.data).exists()  # a missing one: prepare_run says what is wrong


class _Folder:
    """The run folder while a run is prepared: `resume_check` refuses a resume that cannot work before anything
    is written, then `take` (a real run's) locks the folder and claims it; `give_back` undoes that when
    preparing fails."""

    def __init__(self, out: Path, ownership: rundir.Ownership, settings: Settings, warn: Warn):
        self.out, self.ownership, self.settings, self.warn = out, ownership, settings, warn
        self.lock: rundir.FolderLock | None = None

    def take(self) -> None:
        if self.settings.dry_run:
            return
        self.lock = rundir.FolderLock(self.out).acquire()
        for message in self.ownership.messages:
            self.warn(message)
        rundir.claim(self.out, "train", ("cache",), self.ownership.marker)

    def resume_check(self, identity: dict) -> ResumeCheck:
        """What resuming OUT's newest complete checkpoint means for this run; refused (exit 2) when the
        checkpoint was trained with settings that make it mean something else."""
        if not self.settings.resume:
            return ResumeCheck(0)
        marker = rundir.read_marker(self.out) or self.ownership.marker or {}
        step = newest_checkpoint_step(self.settings)
        check = resume_changes(marker.get("run"), identity, step, legacy=marker.get("legacy", False))
        if check.problems:
            raise UserInputError(refusal(self.out, check))
        return check

    def give_back(self) -> None:
        if self.lock is not None:
            rundir.leave_no_trace(self.out, created=self.lock.created)
            self.lock.release()


def write_run(run: PreparedRun, *, resume: bool) -> None:
    """Start the folder over unless resuming a checkpoint (deleting only the previous run's results that this
    tool made), record the run's identity in the marker, then write plan.json, ds_config.json, run_spec.json.
    A Ctrl-C that arrived while the data was prepared stops here, before anything is written."""
    stops.honour()
    if not resume or run.resume_from == 0:
        rundir.start_over(run.out)
    rundir.claim(run.out, "train", rundir.CONFIG_NAMES + rundir.RESULT_NAMES)
    ranks.clear(run.out)  # this launch's ranks say where they ran (job/ranks.py)
    rundir.record_run(run.out, run.job.identity)
    prepare.write(run.job)


def launch_run(run: PreparedRun, *, stdout_to_stderr: bool) -> dict:
    """Run DeepSpeed's launcher to the end; the run's summary (OUT/run.json) or Stopped with its exit code."""
    lock_fd = () if run.lock is None or run.lock.fd is None else (run.lock.fd,)
    code = launch.run(
        run.job.argv, run.job.env, dict(os.environ), stdout_to_stderr=stdout_to_stderr, inherit_fds=lock_fd
    )
    if code != 0:
        argv = run.job.argv
        several = "--hostfile" in argv
        lost = ranks.lost_nodes(run.out, hostfile_hosts(argv[argv.index("--hostfile") + 1])) if several else None
        raise Stopped(stopped_message(run.out, code, several, run.job.spec.node_local_checkpoints, lost), code)
    summary = json.loads((run.out / rundir.SUMMARY_FILE).read_text())
    remember(run.job.plan, summary)
    return summary


def remember(plan: Plan, summary: dict) -> None:
    """A finished run on this host calibrates later plans of its model, strategy and world size here
    (plan/calibration.py)."""
    if plan.host.source != "live":
        return
    from launcher.files import tool_cache_dir
    from launcher.inspection.host import host_id
    from launcher.plan import calibration

    label = plan.chosen.strategy.label
    predicted, measured = summary["predicted"], summary["measured"]
    calibration.record(tool_cache_dir(), host_id(), label, plan.model.name, plan.world_size, predicted, measured)


def stopped_message(
    out: Path, code: int, several_nodes: bool = False, node_local: str | None = None, lost: str | None = None
) -> str:
    """Why the run stopped and what rerunning will do: resume after the newest complete checkpoint, or start
    over when there is none; after a failure (not a signal) the log above says what to fix first. With several
    nodes, `lost` names the ranks that never said they ended (job/ranks.py: killed, or their machine lost), by
    node; else the log says which failed: pdsh starts each of its lines with the host it came from."""
    where = ""
    if lost:
        where = f" on {lost} (started, never ended)"
    elif several_nodes:
        where = " on one of the nodes (the log's first error names it: pdsh starts each line with its host)"
    step = rundir.newest_checkpoint_step(out, node_local)
    then = (
        f"resumes after step {step} (the newest complete checkpoint)"
        if step
        else "starts over (no complete checkpoint yet)"
    )
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        return f"training stopped by {signal.Signals(code - 128).name} (exit {code}); the same command {then}"
    if code in (128 + signal.SIGKILL, 256 - signal.SIGKILL):  # the shell's and DeepSpeed's launch.py's spelling
        return (
            f"training stopped: a rank was killed{where} (SIGKILL, exit {code}; the OOM killer does this when memory "
            f"runs out, and dmesg says so); the same command {then}"
        )
    return f"training stopped{where} (exit {code}); the log above says why: once that is fixed, the same command {then}"
