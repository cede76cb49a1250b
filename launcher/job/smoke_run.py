"""The smoke workflow (`run --smoke`): the planned configuration for a few optimizer steps, reported as named
checks (launcher/job/smoke.py lists them). Returns the SmokeReport; prints nothing (progress and warnings go to
the `warn` callback), and every check that did not run is in the report as skipped."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from launcher.config.dsconfig import InvalidDsConfig
from launcher.config.final import FinalConfig, UserConfig, final_config
from launcher.errors import OffloadLaunchError, UserInputError
from launcher.files import tool_cache_dir
from launcher.job import launch, preflight, prepare, ranks, rundir, smoke
from launcher.job.planning import build_plan
from launcher.job.smoke import Check, SmokeReport
from launcher.job.train import Warn
from launcher.plan.fit import closest_shortfall, fit_summary
from launcher.plan.planner import Plan
from launcher.settings import Settings

MODE_DEFAULTS = {"steps": smoke.DEFAULT_STEPS}  # under what the user types, over a recipe's values
RUN_CHECKS = ("engine", "loss", "memory", "checkpoint", "nvme_cleanup")  # made inside the training processes


def output_dir(settings: Settings) -> Path:
    return Path(settings.output_dir or rundir.default_output_dir(settings.model) + "-smoke")


def run_smoke(
    settings: Settings, *, user: UserConfig | None, launcher_args: tuple[str, ...], warn: Warn
) -> SmokeReport:
    started = time.monotonic()
    out = output_dir(settings)
    if settings.steps < 2:
        raise UserInputError(f"--smoke needs --steps of at least 2 to see the loss fall, got {settings.steps}")
    ownership = rundir.check_folder(out, "smoke", settings.force)
    with rundir.FolderLock(out) as lock:
        for message in ownership.messages:
            warn(message)
        rundir.claim(out, "smoke", ("cache", rundir.SMOKE_MODEL), ownership.marker)
        return _run_smoke(settings, out, started, user, launcher_args, warn, lock)


def _run_smoke(
    settings: Settings,
    out: Path,
    started: float,
    user: UserConfig | None,
    launcher_args: tuple[str, ...],
    warn: Warn,
    lock: rundir.FolderLock,
) -> SmokeReport:
    report = SmokeReport(model=settings.model, strategy=None, layers=settings.smoke_layers, full_model=None)
    if settings.smoke_layers:
        settings = _truncated(settings, report, out)
    settings = replace(settings, resume=False, save_every=0)
    checked = _config_check(settings, report, out, user, warn)
    if checked is None:
        return finish(report)
    plan, final = checked
    data = _data_check(plan, settings, report, out)
    if data is None:
        return finish(report)
    job = _smoke_job(plan, settings, out, final, data, launcher_args, warn)
    warn(f"smoke test: {launch.format_command(job.argv, job.env)}")
    budget = settings.smoke_timeout * 60 - (time.monotonic() - started)
    t0 = time.monotonic()
    code = launch.run(
        job.argv, job.env, dict(os.environ), timeout=max(1.0, budget), stdout_to_stderr=True, inherit_fds=(lock.fd,)
    )
    _run_checks(report, out, code, time.monotonic() - t0, settings.smoke_timeout)
    return finish(report)


def _truncated(settings: Settings, report: SmokeReport, out: Path) -> Settings:
    """--smoke-layers K: the model's config cut to K layers (random weights); the full model's fit is reported."""
    full = build_plan(settings)
    truncated, full_layers = smoke.truncate_model(
        settings.model, settings.smoke_layers, out / rundir.SMOKE_MODEL, settings.trust_remote_code
    )
    report.full_model = {"layers": full_layers, "fits": full.chosen is not None, "summary": fit_summary(full)}
    tokenizer = smoke.tokenizer_source(settings.model, settings.tokenizer)
    return replace(settings, model=str(truncated), tokenizer=tokenizer)


def _config_check(
    settings: Settings, report: SmokeReport, out: Path, user: UserConfig | None, warn: Warn
) -> tuple[Plan, FinalConfig] | None:
    t0 = time.monotonic()
    plan = build_plan(settings)
    if plan.chosen is None:
        report.add(Check("config", False, f"does not fit: {closest_shortfall(plan)}", time.monotonic() - t0))
        return None
    report.strategy = plan.chosen.strategy.label
    if "lr" not in settings.typed:  # the rate only reaches the ds_config, not the memory or time estimates
        plan = replace(plan, workload=replace(plan.workload, lr=smoke.default_lr(plan.model.hidden_size)))
    try:
        final = final_config(plan, user, swap_dir=rundir.run_swap_dir(plan, out), cache_dir=tool_cache_dir())
    except (InvalidDsConfig, UserInputError) as exc:
        report.add(Check("config", False, str(exc), time.monotonic() - t0))
        return None
    for warning in final.warnings:
        warn(warning)
    message = f"{report.strategy}: the schema and DeepSpeed's models accept it"
    report.add(Check("config", True, message, time.monotonic() - t0))
    return plan, final


def _data_check(plan: Plan, settings: Settings, report: SmokeReport, out: Path):
    """The data tokenizes into at least one batch for every rank: (its Tokenization, the training rows), or
    None."""
    t0 = time.monotonic()
    seq_len = plan.workload.seq_len
    try:
        tokenization = prepare.data_layout(plan, settings)
        tokenizer = prepare.load_tokenizer(settings, prepare.model_identity(plan))
        blocks, _ = prepare.load_data(settings, tokenization, tokenizer, out / "cache")
    except OffloadLaunchError as exc:
        report.add(Check("data", False, str(exc), time.monotonic() - t0))
        return None
    need = plan.workload.micro_batch * plan.world_size
    if len(blocks) < need:
        message = f"{len(blocks)} blocks of {seq_len} tokens; one batch needs {need}: add data"
        report.add(Check("data", False, message, time.monotonic() - t0))
        return None
    message = f"{len(blocks):,} blocks of {seq_len} tokens from {settings.data}"
    report.add(Check("data", True, message, time.monotonic() - t0))
    return tokenization, blocks


def _smoke_job(
    plan: Plan,
    settings: Settings,
    out: Path,
    final: FinalConfig,
    data: tuple,
    launcher_args: tuple[str, ...],
    warn: Warn,
) -> prepare.Job:
    """The smoke run's folder, written: the host's limits hold, the folder is started over, and the config
    runs at a constant learning rate (no scheduler: see smoke.default_lr). `data`: _data_check's answer."""
    swap = rundir.run_swap_dir(plan, out)
    prepare.check_nvme_room_for(plan, swap, settings.hostfile)
    preflight.enforce(plan, swap, fatal=True, warn=warn, config=final.config)
    tokenization, rows = data
    job = prepare.assemble(plan, settings, out, final, rows, launcher_args, tokenization)
    rundir.start_over(out, rundir.RESULT_NAMES + (rundir.SMOKE_RESULT, rundir.SMOKE_CHECKPOINT))
    rundir.claim(out, "smoke", rundir.CONFIG_NAMES + rundir.RESULT_NAMES + rundir.SMOKE_NAMES)
    ranks.clear(out)
    ds_config = {k: v for k, v in job.ds_config.items() if k != "scheduler"}
    spec = replace(job.spec, smoke=True, smoke_memory_tolerance=settings.smoke_memory_tolerance, resume=False)
    job = replace(job, ds_config=ds_config, spec=spec)
    prepare.write(job)
    return job


def _run_checks(report: SmokeReport, out: Path, code: int, seconds: float, timeout_minutes: float) -> None:
    """The checks the training processes recorded, then the timeout and exit-code checks."""
    for check in smoke.read_checks(out):
        report.add(check)
    ran = {c.name for c in report.checks}
    for name in RUN_CHECKS:
        if name not in ran:
            report.add(Check(name, None, "not reached: the training processes stopped first"))
    if code == launch.TIMEOUT_EXIT:
        message = f"stopped after {timeout_minutes:g} min (--smoke-timeout); every rank was terminated"
        report.add(Check("timeout", False, message, seconds))
        return
    report.add(Check("timeout", True, f"finished in {seconds:.0f} s of {timeout_minutes:g} min", seconds))
    message = "training processes exited cleanly"
    if code != 0:
        message = f"training processes exited {code}; the log above says why"
    report.add(Check("run", code == 0, message, seconds))


def finish(report: SmokeReport) -> SmokeReport:
    """Every check appears, so CI shows what an early failure left unchecked."""
    ran = {c.name for c in report.checks}
    for name in smoke.CHECKS:
        if name not in ran:
            reason = f"not run: {report.failed.name} failed first" if report.failed else "not run"
            report.add(Check(name, None, reason))
    return report
