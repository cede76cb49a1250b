"""`offload-launch run` (also `offload-launch --model M ...`): plan, write the config and, with --data, train;
with --smoke, check the configuration in minutes. Parses, calls the workflows, prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from launcher import settings
from launcher.cli.options import ToolError, echo_json, options, typed_values, user_errors, warn
from launcher.errors import UserInputError

RUN_EPILOG = """\b
Examples:
  offload-launch --model meta-llama/Llama-2-7b --dry-run
  offload-launch --model ./my-model-dir --dry-run --json --host-spec recipes/hosts/1x-a100-80g.yaml --config-out ds.json
  offload-launch --model meta-llama/Llama-2-70b-hf --dry-run --host-spec recipes/hosts/1x-h100-80g.yaml
  offload-launch --model mistralai/Mistral-7B --dry-run --zero-stage 3 --offload-optimizer cpu
  offload-launch --model meta-llama/Llama-2-7b --data ./ds --output-dir runs/llama7b --steps 1000
  offload-launch --model ./tiny --data ./ds --num-gpus 2 --steps 50
  offload-launch --model M --data ./ds --hostfile hosts.txt --dry-run -- --ssh_port 2222
  offload-launch --recipe llama2-7b-1x24g --dry-run                  # offload-launch recipes lists them
  offload-launch --model M --ds-config my_ds_config.json --dry-run    # your config; "auto" filled from the plan
  offload-launch --model M --data ./ds --smoke --junit-xml smoke.xml  # check the configuration in minutes
"""


@click.command("run", epilog=RUN_EPILOG)
@options(settings.DECLARATIONS)
@click.argument("launcher_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- DEEPSPEED_LAUNCHER_ARGS]")
@click.pass_context
@user_errors
def run(ctx: click.Context, launcher_args: tuple[str, ...], **values) -> None:
    """Plan, write the config and, with --data, train: DeepSpeed's own launcher on a real training loop
    with DeepSpeedCPUAdam, checkpoints, resume and export. Without --data it prints the plan."""
    typed = typed_values(ctx, values)
    chosen, user = resolve(typed)
    if chosen.sbatch:
        sbatch(chosen, user, typed, launcher_args)
    elif chosen.smoke:
        smoke(chosen, user, launcher_args)
    elif chosen.data is None:
        plan_only(chosen, user)
    else:
        train(chosen, user, launcher_args)


def resolve(typed: dict):
    """The layered settings (defaults < recipe < smoke mode < --ds-config pins < typed) and the user's
    ds_config."""
    from launcher import recipes
    from launcher.config.final import read_user_config, user_pins
    from launcher.job.smoke_run import MODE_DEFAULTS

    recipe = recipes.find(typed["recipe"]).options if typed.get("recipe") else None
    user = read_user_config(typed["ds_config"]) if typed.get("ds_config") else None
    mode = dict(MODE_DEFAULTS) if typed.get("smoke") else {}
    if typed.get("lora", (recipe or {}).get("lora")):
        mode |= {key: value for key, value in settings.LORA_MODE_DEFAULTS.items() if key not in (recipe or {})}
    chosen = settings.layer(typed, recipe=recipe, mode=mode or None, pins=user_pins(user))
    if chosen.lora and (chosen.data or chosen.smoke or chosen.sbatch) and importlib.util.find_spec("peft") is None:
        raise UserInputError(settings.ADAPTER_EXTRAS_MISSING)  # planning needs no peft; training does
    return chosen, user


def show_plan(plan, ds_config: dict | None, as_json: bool, show_config: bool = True) -> None:
    """The plan on stdout: JSON, rich tables on a terminal, plain text when piped. Exit 3 when nothing fits."""
    from launcher.plan.fit import does_not_fit
    from launcher.views import plan_view

    if as_json:
        echo_json(plan.to_json(ds_config))
    else:
        from rich.console import Console

        console = Console()  # made here so it writes to this command's stdout (tests capture it)
        if console.is_terminal:  # a person: bars per memory tier and the step-time split
            plan_view.print_plan(plan, ds_config, show_config=show_config, console=console)
        else:  # piped: plain text
            click.echo(plan_view.plan_text(plan, ds_config, show_config=show_config))
    if plan.chosen is None:
        raise does_not_fit(plan)


def write_config(path: str | None, ds_config: dict | None) -> None:
    import json

    if path:
        Path(path).write_text(json.dumps(ds_config, indent=2) + "\n")


def plan_only(chosen, user) -> None:
    from launcher.config.final import final_config
    from launcher.files import tool_cache_dir
    from launcher.job.planning import build_plan

    plan = build_plan(chosen)
    ds_config = None
    if plan.chosen:
        final = final_config(plan, user, cache_dir=tool_cache_dir())
        for warning in final.warnings:
            warn(warning)
        ds_config = final.config
    show_plan(plan, ds_config, chosen.json)
    write_config(chosen.config_out, ds_config)
    if chosen.config_out and not chosen.json:
        click.echo(f"\nwrote {chosen.config_out}")
    if not chosen.dry_run and not chosen.json:
        click.echo("\n(plan only: add --data PATH to train)")


def train(chosen, user, launcher_args: tuple[str, ...]) -> None:
    import json
    import time

    from launcher.job import train as training

    started = time.monotonic()
    chosen, kept = training.keep_checkpoint_strategy(chosen)
    plan = measured_plan(chosen)
    prepared = training.prepare_run(plan, chosen, user=user, launcher_args=launcher_args, warn=warn)
    if kept and prepared.resume_from:
        warn(kept)
    if prepared.job is None:
        show_plan(prepared.plan, None, chosen.json)
    with prepared:  # a real run holds the output folder's lock until it ends
        job, out = prepared.job, prepared.out
        write_config(chosen.config_out, job.ds_config)
        if chosen.dry_run or not chosen.json:  # a training run with --json prints one object: the summary at the end
            show_plan(job.plan, job.ds_config, chosen.json, show_config=chosen.dry_run)
        if chosen.dry_run:
            if not chosen.json:
                then = f"resume after step {prepared.resume_from}" if prepared.resume_from else "start at step 1"
                click.echo(
                    f"\nwould write {out}/plan.json, ds_config.json, run_spec.json, {then} and run:\n{prepared.command}"
                )
            return
        if prepared.finished:
            message = (
                f"{out} already finished all {job.spec.steps} steps (model in {out / 'final'}); pass more --steps to "
                "continue training it, or --no-resume to train it again from the start"
            )
            if chosen.json:
                echo_json(json.loads((out / "run.json").read_text()))
            else:
                click.echo(f"\n{message}")
            return
        training.write_run(prepared, resume=chosen.resume)
        click.echo(
            f"\nwrote {out}/plan.json, ds_config.json, run_spec.json\nlaunching: {prepared.command}\n", err=chosen.json
        )
        summary = training.launch_run(prepared, stdout_to_stderr=chosen.json)
    summary["command_seconds"] = time.monotonic() - started
    if chosen.json:
        echo_json(summary)
    else:
        click.echo(summary_text(summary))


def measured_plan(chosen):
    """The plan a run trains on: planned from what this host's cache holds; when a real run would train on figures
    never measured here, they are measured first (job/measuring.py, in a process that exits before the ranks start:
    job/measuring_process.py; cached) and the run planned again from them.
    Every input the plan reads is checked by the first plan, before anything is measured."""
    from launcher.job import measuring_process
    from launcher.job import train as training
    from launcher.job.planning import build_plan

    plan = build_plan(chosen)
    if not chosen.dry_run and plan.chosen is not None and training.needs_rates(plan, chosen):
        measuring_process.fill_cache(
            plan, model=chosen.model, nvme_path=chosen.nvme_path, trust_remote_code=chosen.trust_remote_code, log=warn
        )
        plan = build_plan(chosen, after_measuring=True)
    return plan


def summary_text(summary: dict) -> str:
    """A finished run's summary as the lines a person reads."""
    speed = f"{summary['tokens_per_s']:,.0f} tokens/s" if summary["tokens_per_s"] else "no new steps (already done)"
    lines = [
        f"\ndone: loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} over {summary['steps']} steps, "
        f"{speed}, optimizer {summary['optimizer']}; {summary['wall_seconds']:.0f} s in the training loop, "
        f"{summary['command_seconds']:.0f} s for the whole command"
    ]
    if summary.get("tokens"):
        tokens = summary["tokens"]
        lines.append(
            f"tokens: {tokens['trained']:,} trained, {tokens['masked']:,} read without loss (prompts, document starts)"
        )
    if summary.get("eval_loss") is not None:
        rows = summary.get("data", {}).get("eval_rows", 0)
        lines.append(f"eval loss: {summary['eval_loss']:.4f} on {rows:,} held-out rows")
    model_class = summary.get("model_class", "AutoModelForCausalLM")
    if summary.get("adapter"):  # a LoRA: OUT/final is a peft adapter folder on top of --model
        lines.append(f"adapter: {summary['final_dir']} (PeftModel.from_pretrained({model_class}(...), this folder))")
    else:
        lines.append(f"model: {summary['final_dir']} ({model_class}.from_pretrained)")
    lines += [f"measured / predicted {name}: {ratio:.2f}" for name, ratio in summary.get("ratios", {}).items()]
    return "\n".join(lines)


def sbatch(chosen, user, typed: dict, launcher_args: tuple[str, ...]) -> None:
    """--sbatch FILE: the training run checked as --dry-run checks it (plan, final config, data; nothing written
    but the script, nothing started), the plan shown, then the batch script that runs the same command on a Slurm
    allocation. No script for a plan that does not fit (exit 3)."""
    import dataclasses

    from launcher.job import sbatch as batch
    from launcher.job import train as training
    from launcher.job.planning import build_plan

    chosen, kept = training.keep_checkpoint_strategy(dataclasses.replace(chosen, dry_run=True))
    plan = build_plan(chosen)
    prepared = training.prepare_run(plan, chosen, user=user, launcher_args=launcher_args, warn=warn)
    if kept and prepared.resume_from:
        warn(kept)
    if prepared.job is None:
        show_plan(prepared.plan, None, chosen.json)
    with prepared:
        job = prepared.job
        write_config(chosen.config_out, job.ds_config)
        show_plan(job.plan, job.ds_config, chosen.json, show_config=False)
        batch_job = batch.batch_job(job.plan, typed, launcher_args)
        path = batch.write(chosen.sbatch, batch_job)
    if plan.host.source == "live":  # often a login node: the script asks for nodes like it
        warn(
            f"--sbatch: planned for this machine ({plan.host.gpus.count} GPU(s), {plan.host.cpu_cores} cores per "
            "node); if the compute nodes differ, describe them with --host-spec NAME|FILE"
        )
    click.echo(
        f"\nwrote {path}: {batch_job.nodes} node(s) x {batch_job.ranks_per_node} rank(s), launcher "
        f"{batch_job.launcher}; submit it with `sbatch {path}`",
        err=chosen.json,
    )


def smoke(chosen, user, launcher_args: tuple[str, ...]) -> None:
    from launcher.job.smoke_run import run_smoke
    from launcher.views import smoke_report

    report = run_smoke(chosen, user=user, launcher_args=launcher_args, warn=warn)
    if chosen.junit_xml:
        smoke_report.write_junit(report, Path(chosen.junit_xml))
    if chosen.json:
        echo_json(report.to_json())
    else:
        click.echo(smoke_report.text(report))
    if report.failed:
        raise ToolError(f"smoke check '{report.failed.name}' failed: {report.failed.message}", report.exit_code)
