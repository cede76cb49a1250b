"""The training workflow, in the steps the CLI shows between: plan and prepare (nothing started, nothing
written but the data cache), write the run folder, launch DeepSpeed's launcher and read the summary.

Prints nothing: messages meant for the user while it works go to the `warn` callback the caller passes,
problems are raised as domain errors (launcher/errors.py) carrying their exit code.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.config.final import UserConfig
from launcher.errors import Stopped, UserInputError
from launcher.job import launch, preflight, prepare, rundir
from launcher.job.prepare import Job
from launcher.plan.planner import Plan
from launcher.settings import Settings

Warn = Callable[[str], None]


@dataclass(frozen=True)
class PreparedRun:
    plan: Plan
    job: Job | None  # None when nothing fits (the caller shows the plan and stops with exit 3)
    out: Path  # the run folder as the user named it (--output-dir, else runs/<model>)

    @property
    def command(self) -> str:
        return launch.format_command(self.job.argv, self.job.env)


def output_dir(settings: Settings) -> Path:
    return Path(settings.output_dir or rundir.default_output_dir(settings.model))


def prepare_run(
    plan: Plan,
    settings: Settings,
    *,
    user: UserConfig | None,
    launcher_args: tuple[str, ...],
    warn: Warn,
) -> PreparedRun:
    """Checks in the order that loses nothing: the run folder's owner, the host's limits (fatal unless
    --dry-run), then the job (final config, data). A real run tokenizes into OUT/cache; nothing else is
    written."""
    out = output_dir(settings)
    if plan.chosen is None:
        return PreparedRun(plan, None, out)
    rundir.check_owner(out, prepare.model_identity(plan), str(Path(settings.data).resolve()), settings.force)
    if settings.bind_cores and shutil.which("numactl") is None:
        raise UserInputError("--bind-cores needs numactl (DeepSpeed binds ranks with it): apt-get install numactl")
    preflight.enforce(plan, rundir.run_swap_dir(plan, out), fatal=not settings.dry_run, warn=warn)
    job = prepare.prepare(
        plan, settings, output_dir=out, user=user, launcher_args=launcher_args, tokenize=not settings.dry_run
    )
    for warning in job.warnings:
        warn(warning)
    return PreparedRun(job.plan, job, out)


def write_run(run: PreparedRun, *, resume: bool) -> None:
    """Start the folder over unless resuming, then write plan.json, ds_config.json and run_spec.json."""
    if not resume:
        rundir.start_over(run.out)
    prepare.write(run.job)


def launch_run(run: PreparedRun, *, stdout_to_stderr: bool) -> dict:
    """Run DeepSpeed's launcher to the end; the run's summary (OUT/run.json) or Stopped with its exit code."""
    code = launch.run(run.job.argv, run.job.env, dict(os.environ), stdout_to_stderr=stdout_to_stderr)
    if code != 0:
        raise Stopped(
            f"training stopped (exit {code}); rerun the same command to resume from the newest complete "
            f"checkpoint in {run.out / 'checkpoints'}",
            code,
        )
    return json.loads((run.out / "run.json").read_text())
