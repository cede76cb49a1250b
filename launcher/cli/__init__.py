"""The command line: parse, call the pure core, print. The only module that reads the environment,
prints, and turns domain errors into exit codes (0 ok, 2 bad input, 3 does not fit)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import click

from launcher import __version__
from launcher.errors import DoesNotFit, OffloadLaunchError, UserInputError

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


class ToolError(click.ClickException):
    """A domain error shown as one line, with the domain's exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def user_errors(func):
    """Turn OffloadLaunchError into a one-line message and its exit code; tracebacks are for bugs only."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except OffloadLaunchError as err:
            raise ToolError(str(err), err.exit_code) from None

    return wrapper


class DefaultGroup(click.Group):
    """`offload-launch --model M ...` runs the `run` command; subcommands keep their names."""

    default_command = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str):
        """Completing the first word: subcommands, and the options of `run` (which it stands for)."""
        results = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-"):
            run_command = self.commands[self.default_command]
            sub = run_command.make_context(self.default_command, [], parent=ctx, resilient_parsing=True)
            results += run_command.shell_complete(sub, incomplete)
        return results


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=RUN_EPILOG)
@click.version_option(__version__, prog_name="offload-launch")
def cli() -> None:
    """Plan, configure and launch DeepSpeed fine-tuning of models bigger than your GPU.

    `offload-launch --model M ...` is short for `offload-launch run --model M ...`: it sizes the model
    exactly, reads the host (or a described one), picks the ZeRO stage and offload tiers with the
    decision framework, writes a validated ds_config, and with --data trains with DeepSpeed.
    """


def plan_options(func):
    """Options shared by every command that makes a plan."""
    options = [
        click.option(
            "--model",
            "model_spec",
            metavar="ID|DIR",
            help="Hugging Face hub id (e.g. meta-llama/Llama-2-7b) or a local directory with config.json.",
        ),
        click.option(
            "--recipe",
            metavar="NAME|FILE",
            help="Start from a recipe (offload-launch recipes lists them); options you type override it.",
        ),
        click.option("--trust-remote-code", is_flag=True, help="Allow model code shipped with the checkpoint."),
        click.option(
            "--ds-config",
            "ds_config_base",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help='Your ds_config as the base: your values win, "auto" values are filled from the plan, and the '
            "merged result is linted and validated like a generated one. Its ZeRO stage, offload devices, "
            "micro-batch and accumulation pin the plan.",
        ),
        click.option(
            "--host-spec",
            type=click.Path(dir_okay=False),
            metavar="NAME|FILE",
            help="Plan for a described host instead of probing this machine: a name from recipes/hosts "
            "(e.g. 1x-a100-80g), a YAML/JSON file, or 'this'.",
        ),
        click.option("--nvme-path", metavar="DIR", help="Folder on a local NVMe drive for ZeRO-Infinity swap files."),
        click.option("--num-gpus", type=int, help="Ranks per node (default: every GPU; 1 on a CPU-only host)."),
        click.option(
            "--zero-stage",
            type=click.Choice(["auto", "1", "2", "3"]),
            default="auto",
            show_default=True,
            help="Pin the ZeRO stage.",
        ),
        click.option(
            "--offload-optimizer",
            type=click.Choice(["auto", "none", "cpu", "nvme"]),
            default="auto",
            show_default=True,
            help="Pin where the optimizer states and the Adam step live.",
        ),
        click.option(
            "--offload-param",
            type=click.Choice(["auto", "none", "cpu", "nvme"]),
            default="auto",
            show_default=True,
            help="Pin where the 16-bit parameters live (cpu/nvme need ZeRO-3).",
        ),
        click.option("--seq-len", type=int, help="Tokens per sequence [default: model maximum, at most 2048]."),
        click.option("--allow-long-seq", is_flag=True, help="Allow --seq-len above the model's max positions."),
        click.option("--micro-batch", type=int, default=1, show_default=True, help="Sequences per rank per step."),
        click.option(
            "--grad-accum", type=int, default=1, show_default=True, help="Micro-batches accumulated per optimizer step."
        ),
        click.option(
            "--precision",
            type=click.Choice(["auto", "bf16", "fp16"]),
            default="auto",
            show_default=True,
            help="16-bit format (auto: bf16 where the GPU has it).",
        ),
        click.option(
            "--activation-checkpointing/--no-activation-checkpointing",
            default=True,
            show_default=True,
            help="Recompute activations in backward to save memory.",
        ),
        click.option("--lr", type=float, default=2e-5, show_default=True, help="Peak learning rate."),
        click.option("--warmup-steps", type=int, default=10, show_default=True, help="Linear warm-up steps."),
        click.option("--steps", type=int, default=100, show_default=True, help="Optimizer steps."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def train_options(func):
    """Options of a training run (used when --data is given)."""
    options = [
        click.option(
            "--data",
            metavar="PATH",
            help="Training data: a datasets save_to_disk folder, or .jsonl/.json/.txt/.parquet/.csv files.",
        ),
        click.option("--text-field", default="text", show_default=True, help="Field holding the text."),
        click.option("--tokenizer", metavar="ID|DIR", help="Tokenizer source when the model folder has none."),
        click.option("--output-dir", metavar="DIR", help="Run folder [default: runs/<model name>]."),
        click.option("--epochs", type=float, help="Passes over the data (overrides --steps)."),
        click.option(
            "--save-every",
            type=int,
            default=0,
            show_default=True,
            help="Checkpoint every N optimizer steps (0: only at the end).",
        ),
        click.option(
            "--keep-checkpoints", type=int, default=2, show_default=True, help="Complete checkpoints to keep."
        ),
        click.option(
            "--resume/--no-resume",
            default=True,
            show_default=True,
            help="Continue from the newest complete checkpoint in --output-dir, or start over.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for data order and init."),
        click.option("--force", is_flag=True, help="Reuse an --output-dir that holds a different run."),
        click.option(
            "--hostfile",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="DeepSpeed hostfile ('host slots=N' per line) for several machines.",
        ),
        click.option(
            "--launcher",
            "multinode_launcher",
            type=click.Choice(["pdsh", "openmpi", "mvapich", "slurm"]),
            default="pdsh",
            show_default=True,
            help="How DeepSpeed reaches the other machines.",
        ),
        click.option("--master-addr", help="Address of the rank-0 machine (multi-node)."),
        click.option("--master-port", type=int, help="Rendezvous port [default: a free port]."),
        click.option(
            "--bind-cores/--no-bind-cores",
            default=False,
            show_default=True,
            help="Pin each rank to its share of cores (DeepSpeed --bind_cores_to_rank, needs numactl).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def hostfile_nodes(path: str) -> int:
    """Machines listed in a DeepSpeed hostfile ('hostname slots=N', '#' comments)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserInputError(
            f"--hostfile {path}: {exc.strerror}; pass a file with one 'hostname slots=N' per line"
        ) from None
    hosts = [line.split()[0] for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not hosts:
        raise UserInputError(f"--hostfile {path} lists no hosts; write one 'hostname slots=N' per line")
    return len(hosts)


def tool_cache_dir() -> Path:
    """$XDG_CACHE_HOME/offload-launch (default ~/.cache/offload-launch): probe figures, model profiles,
    and the fingerprints of configs DeepSpeed already accepted."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offload-launch"


def build_plan(opts: dict):
    """Inspect the host and the model, then plan. Heavy imports stay inside so `--help` is instant."""
    from dataclasses import replace

    from launcher.inspection.host import load_host_spec, probe_host, with_nvme_path
    from launcher.inspection.model import inspect_model
    from launcher.plan.planner import Workload, make_plan

    if opts.get("user_config"):
        from launcher.config import lint

        ctx = click.get_current_context(silent=True)
        for name, value in lint.pins_from_config(opts["user_config"]).items():
            typed = ctx is not None and ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
            mine = str(opts[name]).rstrip("/") if opts[name] is not None else None
            if typed and mine not in ("auto", str(value).rstrip("/")):
                flag = "--" + name.replace("_", "-")
                raise UserInputError(
                    f"{flag} {opts[name]} contradicts {value!r} in --ds-config {opts['ds_config_base']}; "
                    "set it in one place"
                )
            opts = opts | {name: value}
    workload = Workload(
        seq_len=opts["seq_len"],
        micro_batch=opts["micro_batch"],
        grad_accum=opts["grad_accum"],
        precision=opts["precision"],
        activation_checkpointing=opts["activation_checkpointing"],
        num_gpus=opts["num_gpus"],
        zero_stage=opts["zero_stage"],
        offload_optimizer=opts["offload_optimizer"],
        offload_param=opts["offload_param"],
        nvme_path=opts["nvme_path"],
        lr=opts["lr"],
        warmup_steps=opts["warmup_steps"],
        steps=opts["steps"],
        allow_long_seq=opts["allow_long_seq"],
    )
    if opts["host_spec"]:
        host = load_host_spec(opts["host_spec"])
        if opts["nvme_path"]:
            host = with_nvme_path(host, opts["nvme_path"])
    else:
        host = probe_host(opts["nvme_path"])
    if opts.get("hostfile"):
        host = replace(host, nodes=hostfile_nodes(opts["hostfile"]))
    model = inspect_model(opts["model_spec"], trust_remote_code=opts["trust_remote_code"], cache_dir=tool_cache_dir())
    rates, aio = host_rates(host, opts["nvme_path"], model.hidden_size)
    return make_plan(model, host, workload, rates, aio)


def host_rates(host, nvme_path: str | None, width: int):
    """Rates for the step-time model: this host's cached probe (if it is this host), else described/nominal;
    and the aio settings the probe found best for the NVMe folder it measured."""
    from launcher.inspection import rates as probe

    cached = None
    if host.source == "live":
        cached = probe.load_cached(probe.cache_path(tool_cache_dir()), probe.host_id())
    aio = None
    if cached and cached.aio and nvme_path and cached.details.get("nvme_path") == nvme_path:
        aio = cached.aio
    return probe.resolve_rates(host, cached, width), aio


def show_plan(plan, ds_config: dict | None, as_json: bool, show_config: bool = True) -> None:
    from launcher.views import plan_view as report

    if as_json:
        click.echo(json.dumps(report.plan_json(plan, ds_config), indent=2))
    else:
        from rich.console import Console

        console = Console()  # made here so it writes to this command's stdout (tests capture it)
        if console.is_terminal:  # a person: bars per memory tier and the step-time split
            report.print_plan(plan, ds_config, show_config=show_config, console=console)
        else:  # piped: plain text
            click.echo(report.plan_text(plan, ds_config, show_config=show_config))
    if plan.chosen is None:
        raise DoesNotFit(
            f"{plan.model.name} does not fit this host with any allowed strategy; closest: {closest_shortfall(plan)}; "
            "see the candidates table"
        )


def closest_shortfall(plan) -> str:
    """The candidate that misses by the least (largest need / capacity over its tiers), with its numbers."""
    from launcher.plan import planner as planning

    def overshoot(candidate) -> float:
        m, host = candidate.memory, plan.host
        ratios = [m.cpu_bytes / max(1, planning.usable_cpu_bytes(host))]
        if host.has_gpu:
            ratios.append(m.gpu_bytes_per_device / max(1, planning.usable_gpu_bytes(host)))
        if m.nvme_bytes:
            ratios.append(m.nvme_bytes / max(1, planning.usable_nvme_bytes(host)) if host.nvme else float("inf"))
        return max(ratios)

    if not plan.candidates:
        return "no strategy matches the pinned --zero-stage/--offload-* combination"
    best = min(plan.candidates, key=overshoot)
    return f"{best.strategy.label} ({'; '.join(best.problems)})"


def run_defaults() -> dict:
    """Every `run` option at its default, for commands that plan without being `run`."""
    return run.make_context("run", [], resilient_parsing=True).params


def apply_recipe(ctx: click.Context, opts: dict) -> None:
    """Lay the recipe's options under what the user typed; resolve --host-spec names; require a model."""
    from click.core import ParameterSource

    from launcher import recipes

    if opts["recipe"]:
        recipe = recipes.find(opts["recipe"])
        for name, value in recipe.options.items():
            if ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
                opts[name] = value
    if ctx.get_parameter_source("host_spec") is ParameterSource.COMMANDLINE:
        opts["host_spec"] = recipes.host_spec_path(opts["host_spec"])  # a name, a file, or 'this'
    if not opts["model_spec"]:
        raise UserInputError("missing --model ID|DIR; pass one, or --recipe NAME (offload-launch recipes lists them)")


RECIPES_EPILOG = """\b
Examples:
  offload-launch recipes
  offload-launch --recipe llama2-7b-1x24g --dry-run
  offload-launch --recipe llama2-7b-1x24g --data ./ds --host-spec this   # on this machine
"""


@cli.command("recipes", epilog=RECIPES_EPILOG)
@user_errors
def recipes_command() -> None:
    """List the bundled recipes, the strategy each plans, and who each is for."""
    from launcher import recipes

    defaults = run_defaults()
    for recipe in recipes.available():
        plan = build_plan(defaults | recipe.options)
        label = plan.chosen.strategy.label if plan.chosen else "does not fit"
        click.echo(f"{recipe.name:<26} {label:<34} {recipe.summary}")


@cli.command("run", epilog=RUN_EPILOG)
@plan_options
@train_options
@click.option("--dry-run", is_flag=True, help="Print the plan, the ds_config and the launch command; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object (see README, 'JSON contract').")
@click.option(
    "--config-out", type=click.Path(dir_okay=False, writable=True), metavar="PATH", help="Write the ds_config to PATH."
)
@click.option(
    "--smoke",
    is_flag=True,
    help="Check the configuration in minutes instead of training: a few steps (--steps, default 3) and named "
    "checks (config, data, engine, loss, memory, checkpoint, NVMe clean-up); exit 10-18 names the failed one.",
)
@click.option(
    "--smoke-layers",
    type=click.IntRange(min=1),
    metavar="K",
    help="With --smoke: keep the real shapes but only K transformer layers, random weights.",
)
@click.option(
    "--smoke-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=15.0,
    show_default=True,
    metavar="MINUTES",
    help="With --smoke: fail (exit 17) instead of hanging past this many minutes.",
)
@click.option(
    "--smoke-memory-tolerance",
    type=click.FloatRange(min=0, min_open=True),
    default=1.25,
    show_default=True,
    metavar="RATIO",
    help="With --smoke: the largest measured / predicted peak memory per tier the memory check accepts.",
)
@click.option(
    "--junit-xml",
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="With --smoke: also write the checks as JUnit XML (one test case per check) for CI.",
)
@click.argument("launcher_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- DEEPSPEED_LAUNCHER_ARGS]")
@user_errors
def run(
    dry_run: bool,
    as_json: bool,
    config_out: str | None,
    smoke: bool,
    smoke_layers: int | None,
    smoke_timeout: float,
    smoke_memory_tolerance: float,
    junit_xml: str | None,
    launcher_args: tuple[str, ...],
    **opts,
) -> None:
    """Plan, write the config and, with --data, train: DeepSpeed's own launcher on a real training loop
    with DeepSpeedCPUAdam, checkpoints, resume and export. Without --data it prints the plan."""
    from launcher.config import dsconfig

    apply_recipe(click.get_current_context(), opts)
    opts["user_config"] = read_ds_config(opts["ds_config_base"]) if opts["ds_config_base"] else None
    smoke_only = [name for name, value in (("--smoke-layers", smoke_layers), ("--junit-xml", junit_xml)) if value]
    if smoke_only and not smoke:
        raise UserInputError(f"{smoke_only[0]} only applies to a smoke test: add --smoke")
    if smoke:
        if opts["data"] is None:
            raise UserInputError("--smoke trains a few steps on real data: add --data PATH")
        if dry_run:
            raise UserInputError("--smoke and --dry-run exclude each other: a smoke test runs; drop one")
        report = smoke_test(
            opts,
            layers=smoke_layers,
            timeout_minutes=smoke_timeout,
            tolerance=smoke_memory_tolerance,
            as_json=as_json,
            junit_xml=junit_xml,
            launcher_args=launcher_args,
        )
        if report.failed:
            raise ToolError(f"smoke check '{report.failed.name}' failed: {report.failed.message}", report.exit_code)
        return

    if opts["data"] is None:
        plan = build_plan(opts)
        ds_config = None
        if plan.chosen:
            ds_config = final_config(plan, dsconfig.render(plan), opts)
            dsconfig.validate(ds_config, plan.world_size, cache_dir=tool_cache_dir())
        show_plan(plan, ds_config, as_json)
        if config_out:
            Path(config_out).write_text(json.dumps(ds_config, indent=2) + "\n")
            if not as_json:
                click.echo(f"\nwrote {config_out}")
        if not dry_run and not as_json:
            click.echo("\n(plan only: add --data PATH to train)")
        return
    train(opts, dry_run=dry_run, as_json=as_json, config_out=config_out, launcher_args=launcher_args)


def _job_options(opts: dict, output_dir: str, launcher_args: tuple[str, ...]):
    from launcher.job import prepare as jobs

    return jobs.JobOptions(
        data=opts["data"],
        output_dir=output_dir,
        text_field=opts["text_field"],
        tokenizer=opts["tokenizer"],
        epochs=opts["epochs"],
        save_every=opts["save_every"],
        keep_checkpoints=opts["keep_checkpoints"],
        resume=opts["resume"],
        seed=opts["seed"],
        trust_remote_code=opts["trust_remote_code"],
        hostfile=opts["hostfile"],
        launcher=opts["multinode_launcher"],
        master_addr=opts["master_addr"],
        master_port=opts["master_port"],
        bind_cores=opts["bind_cores"],
        launcher_args=launcher_args,
        user_config=opts.get("user_config"),
    )


def train(opts: dict, *, dry_run: bool, as_json: bool, config_out: str | None, launcher_args: tuple[str, ...]) -> None:
    from launcher.job import launch, rundir
    from launcher.job import prepare as jobs

    output_dir = opts["output_dir"] or rundir.default_output_dir(opts["model_spec"])
    job_opts = _job_options(opts, output_dir, launcher_args)
    out = Path(output_dir)
    plan = build_plan(opts)
    if plan.chosen is None:
        show_plan(plan, None, as_json)
    rundir.check_owner(out, jobs.model_identity(plan), str(Path(opts["data"]).resolve()), opts["force"])
    if opts.get("ds_config_base"):  # refuse a broken user config before the data is tokenized
        from launcher.config import dsconfig

        final_config(plan, dsconfig.render(plan), opts)
    if opts["bind_cores"] and shutil.which("numactl") is None:
        raise UserInputError("--bind-cores needs numactl (DeepSpeed binds ranks with it): apt-get install numactl")
    host_checks(plan, out, fatal=not dry_run)
    job = jobs.prepare(plan, job_opts, tokenize=not dry_run, cache_dir=tool_cache_dir())
    if config_out:
        Path(config_out).write_text(json.dumps(job.ds_config, indent=2) + "\n")
    if dry_run or not as_json:  # a training run with --json prints one object: the summary at the end
        show_plan(job.plan, job.ds_config, as_json, show_config=dry_run)
    command = launch.format_command(job.argv, job.env)
    if dry_run:
        if not as_json:
            click.echo(f"\nwould write {out}/plan.json, ds_config.json, run_spec.json and run:\n{command}")
        return
    if not opts["resume"]:
        rundir.start_over(out)
    jobs.write(job)
    click.echo(f"\nwrote {out}/plan.json, ds_config.json, run_spec.json\nlaunching: {command}\n", err=as_json)
    code = launch.run(job.argv, job.env, dict(os.environ), stdout_to_stderr=as_json)
    if code != 0:
        raise ToolError(
            f"training stopped (exit {code}); rerun the same command to resume from the newest complete "
            f"checkpoint in {out / 'checkpoints'}",
            code,
        )
    summary = json.loads((out / "run.json").read_text())
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    speed = f"{summary['tokens_per_s']:,.0f} tokens/s" if summary["tokens_per_s"] else "no new steps (already done)"
    click.echo(
        f"\ndone: loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} over {summary['steps']} steps, "
        f"{speed}, optimizer {summary['optimizer']}, {summary['wall_seconds']:.0f} s\n"
        f"model: {summary['final_dir']} (AutoModelForCausalLM.from_pretrained)"
    )
    for name, ratio in summary.get("ratios", {}).items():
        click.echo(f"measured / predicted {name}: {ratio:.2f}")


def smoke_test(
    opts: dict,
    *,
    layers: int | None,
    timeout_minutes: float,
    tolerance: float,
    as_json: bool,
    junit_xml: str | None,
    launcher_args: tuple[str, ...],
):
    """--smoke: the planned configuration for a few steps, as named checks (launcher/smoke.py). Returns the
    SmokeReport after printing it (text, or one JSON object) and writing --junit-xml."""
    import time
    from dataclasses import replace

    from launcher.config import dsconfig
    from launcher.config.dsconfig import InvalidDsConfig
    from launcher.job import launch, rundir, smoke
    from launcher.job import prepare as jobs

    started = time.monotonic()
    ctx = click.get_current_context()
    opts = dict(opts)
    # Smoke defaults, unless given: 3 steps on one batch at a constant rate scaled to the width (smoke.default_lr).
    if ctx.get_parameter_source("steps") is click.core.ParameterSource.DEFAULT:
        opts["steps"] = smoke.DEFAULT_STEPS
    default_lr = ctx.get_parameter_source("lr") is click.core.ParameterSource.DEFAULT
    model_spec = opts["model_spec"]
    out = Path(opts["output_dir"] or rundir.default_output_dir(model_spec) + "-smoke")
    if opts["steps"] < 2:
        raise UserInputError(f"--smoke needs --steps of at least 2 to see the loss fall, got {opts['steps']}")
    rundir.check_not_a_training_run(out, opts["force"])
    report = smoke.SmokeReport(model=model_spec, strategy=None, layers=layers, full_model=None)

    if layers:
        full = build_plan(opts)
        truncated, full_layers = smoke.truncate_model(
            model_spec, layers, out / "smoke-model", opts["trust_remote_code"]
        )
        report.full_model = {"layers": full_layers, "fits": full.chosen is not None, "summary": _fit_summary(full)}
        opts["tokenizer"] = smoke.tokenizer_source(model_spec, opts["tokenizer"])
        opts["model_spec"] = str(truncated)

    t0 = time.monotonic()
    plan = build_plan(opts)
    job_opts = _job_options(opts, str(out), launcher_args)
    job_opts = replace(job_opts, resume=False, save_every=0)
    if plan.chosen is None:
        report.add(smoke.Check("config", False, f"does not fit: {closest_shortfall(plan)}", time.monotonic() - t0))
        return _finish_smoke(report, as_json, junit_xml)
    report.strategy = plan.chosen.strategy.label
    if default_lr:  # the rate only reaches the ds_config, not the memory or time estimates
        plan = replace(plan, workload=replace(plan.workload, lr=smoke.default_lr(plan.model.hidden_size)))
    try:
        final = final_config(plan, dsconfig.render(plan, nvme_path=rundir.run_swap_dir(plan, out)), opts)
        dsconfig.validate(final, plan.world_size, cache_dir=tool_cache_dir())
    except (InvalidDsConfig, UserInputError) as exc:
        report.add(smoke.Check("config", False, str(exc), time.monotonic() - t0))
        return _finish_smoke(report, as_json, junit_xml)
    report.add(
        smoke.Check(
            "config", True, f"{report.strategy}: the schema and DeepSpeed's models accept it", time.monotonic() - t0
        )
    )

    t0 = time.monotonic()
    try:
        blocks = jobs.load_blocks(job_opts, jobs.model_identity(plan), plan.workload.seq_len, out / "cache")
    except OffloadLaunchError as exc:
        report.add(smoke.Check("data", False, str(exc), time.monotonic() - t0))
        return _finish_smoke(report, as_json, junit_xml)
    need = plan.workload.micro_batch * plan.world_size
    if len(blocks) < need:
        message = f"{len(blocks)} blocks of {plan.workload.seq_len} tokens; one batch needs {need}: add data"
        report.add(smoke.Check("data", False, message, time.monotonic() - t0))
        return _finish_smoke(report, as_json, junit_xml)
    message = f"{len(blocks):,} blocks of {plan.workload.seq_len} tokens from {opts['data']}"
    report.add(smoke.Check("data", True, message, time.monotonic() - t0))

    job = jobs.prepare(plan, job_opts, tokenize=True, cache_dir=tool_cache_dir())
    host_checks(plan, out, fatal=True)
    rundir.start_over(out)
    (out / smoke.RESULT_FILE).unlink(missing_ok=True)
    for leftover in (out / "smoke-checkpoint").glob("*"):  # a previous smoke run's (the folder may be a mount)
        shutil.rmtree(leftover, ignore_errors=True)
    ds_config = {k: v for k, v in job.ds_config.items() if k != "scheduler"}  # constant lr: see smoke.default_lr
    spec = replace(job.spec, smoke=True, smoke_memory_tolerance=tolerance, resume=False)
    job = replace(job, ds_config=ds_config, spec=spec)
    jobs.write(job)
    click.echo(f"smoke test: {launch.format_command(job.argv, job.env)}", err=True)
    budget = timeout_minutes * 60 - (time.monotonic() - started)
    t0 = time.monotonic()
    code = launch.run(job.argv, job.env, dict(os.environ), timeout=max(1.0, budget), stdout_to_stderr=True)
    seconds = time.monotonic() - t0
    for check in smoke.read_checks(out):
        report.add(check)
    ran = {c.name for c in report.checks}
    for name in ("engine", "loss", "memory", "checkpoint", "nvme_cleanup"):
        if name not in ran:
            report.add(smoke.Check(name, None, "not reached: the training processes stopped first"))
    if code == launch.TIMEOUT_EXIT:
        report.add(
            smoke.Check(
                "timeout",
                False,
                f"stopped after {timeout_minutes:g} min (--smoke-timeout); every rank was terminated",
                seconds,
            )
        )
    else:
        report.add(smoke.Check("timeout", True, f"finished in {seconds:.0f} s of {timeout_minutes:g} min", seconds))
        report.add(
            smoke.Check(
                "run",
                code == 0,
                "training processes exited cleanly"
                if code == 0
                else f"training processes exited {code}; the log above says why",
                seconds,
            )
        )
    return _finish_smoke(report, as_json, junit_xml)


def _fit_summary(plan) -> str:
    from launcher.units import fmt_bytes

    if plan.chosen is None:
        return "does not fit with any strategy (offload-launch --dry-run shows why)"
    m = plan.chosen.memory
    parts = [
        f"GPU {fmt_bytes(m.gpu_bytes_per_device)} per device" if plan.host.has_gpu else None,
        f"CPU {fmt_bytes(m.cpu_bytes)} per node",
        f"NVMe {fmt_bytes(m.nvme_bytes)}" if m.nvme_bytes else None,
    ]
    return f"{plan.chosen.strategy.label}: " + ", ".join(p for p in parts if p)


def _finish_smoke(report, as_json: bool, junit_xml: str | None):
    from launcher.job import smoke

    ran = {c.name for c in report.checks}
    for name in smoke.CHECKS:  # every check appears, so CI shows what an early failure left unchecked
        if name not in ran:
            report.add(
                smoke.Check(name, None, f"not run: {report.failed.name} failed first" if report.failed else "not run")
            )
    if junit_xml:
        smoke.write_junit(report, Path(junit_xml))
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else smoke.text(report))
    return report


def read_ds_config(path: str) -> dict:
    """A user's ds_config file (JSON), or a one-line error naming the file and the line."""
    from launcher import textfiles

    try:
        text = textfiles.read_text(path)
    except OSError as exc:
        raise UserInputError(f"--ds-config {path}: {exc.strerror}; pass an existing ds_config JSON file") from None
    config = textfiles.parse(text, path, as_json=True)
    if not isinstance(config, dict):
        raise UserInputError(f"{path}: a ds_config is a JSON object, got a {type(config).__name__}")
    return config


def final_config(plan, generated: dict, opts: dict) -> dict:
    """The generated ds_config, or the user's (--ds-config) with its "auto" values filled from it, linted
    against this plan (warnings printed, the first error refused)."""
    if not opts.get("user_config"):
        return generated
    from launcher.config import lint

    merged, warnings = lint.apply_user_config(opts["user_config"], generated, plan)
    for finding in warnings:
        click.echo(f"{opts['ds_config_base']}: {finding}", err=True)
    return merged


CHECK_EPILOG = """\b
Examples:
  offload-launch check ds_config.json --model meta-llama/Llama-2-7b                # for this machine
  offload-launch check ds_config.json --model meta-llama/Llama-2-70b-hf --host-spec 1x-a100-80g --nvme-path /nvme
  offload-launch check ds_config.json --model ./my-model --num-gpus 8 --json
"""


@cli.command("check", epilog=CHECK_EPILOG)
@click.argument("config_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--model", "model_spec", required=True, metavar="ID|DIR", help="The model the config is for.")
@click.option("--trust-remote-code", is_flag=True, help="Allow model code shipped with the checkpoint.")
@click.option("--host-spec", metavar="NAME|FILE", help="Check against a described host instead of this machine.")
@click.option("--nvme-path", metavar="DIR", help="The NVMe folder the config's offload would use (for its free space).")
@click.option("--num-gpus", type=int, help="Ranks per node (default: every GPU; 1 on a CPU-only host).")
@click.option("--hostfile", type=click.Path(dir_okay=False), metavar="FILE", help="DeepSpeed hostfile (node count).")
@click.option("--seq-len", type=int, help="Tokens per sequence, for activation memory [default: model max, <= 2048].")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
@user_errors
def check_command(config_file: str, as_json: bool, **opts) -> None:
    """Lint an existing ds_config for a model and host: unknown keys (with the nearest valid one), type
    errors with their JSON path, float sizes DeepSpeed needs as integers, renamed aio keys, swap buffers
    smaller than the largest parameter, batch arithmetic, and offload that will not fit this host's RAM or
    disk. Exit 0 when there is no error (warnings allowed), 2 otherwise."""
    from launcher import recipes
    from launcher.config import lint

    config = read_ds_config(config_file)
    if opts["host_spec"]:
        opts["host_spec"] = recipes.host_spec_path(opts["host_spec"])
    pins = {k: v for k, v in lint.pins_from_config(config).items() if k in ("micro_batch", "grad_accum")}
    plan_opts = run_defaults() | opts | pins
    plan = build_plan(plan_opts)
    findings = lint.lint(config, plan, plan.world_size)
    errors = sum(f.level == "error" for f in findings)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "file": config_file,
                    "world_size": plan.world_size,
                    "errors": errors,
                    "findings": [f.to_json() for f in findings],
                },
                indent=2,
            )
        )
    else:
        for finding in findings:
            click.echo(str(finding))
        warnings = len(findings) - errors
        click.echo(
            f"{config_file}: {errors} error(s), {warnings} warning(s) for {plan.model.name} at world size "
            f"{plan.world_size} on {plan.host.source} host"
        )
    if errors:
        raise ToolError(f"{config_file} has {errors} error(s); see above", 2)


REPORT_EPILOG = """\b
Examples:
  offload-launch report runs/demo                  # writes runs/demo/report.png
  offload-launch report runs/demo --out demo.svg
"""


@cli.command("report", epilog=REPORT_EPILOG)
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False))
@click.option("--out", metavar="PNG", help="Image to write (.png, .svg or .pdf) [default: RUN/report.png].")
@user_errors
def report_command(run_dir: str, out: str | None) -> None:
    """Render a run folder as an image: loss and step time over the steps, the plan's predicted step time,
    and measured / predicted memory and speed."""
    from launcher.views import run_chart as plot

    path = plot.render_run(Path(run_dir), Path(out) if out else Path(run_dir) / "report.png")
    click.echo(f"wrote {path}")


def host_checks(plan, out: Path, *, fatal: bool) -> None:
    """This machine's limits against the plan, before anything is written or started: a failed check stops a
    real run with its exit code; a dry run (or a non-fatal check) prints it as a warning on stderr."""
    from launcher.job import preflight, rundir

    problems = preflight.check(plan, own_swap_dir=rundir.run_swap_dir(plan, out))
    for problem in problems:
        if not (fatal and problem.fatal):
            click.echo(f"warning: {problem.message}", err=True)
    for problem in problems:
        if fatal and problem.fatal:
            raise ToolError(problem.message, problem.exit_code)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send file descriptor 1 to stderr for the duration (libraries that print from C++ too)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (e.g. under CliRunner): nothing to redirect
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


PROBE_EPILOG = """\b
Examples:
  offload-launch probe                          # CPU bandwidth, CPU-Adam, PCIe (with a GPU); about a minute
  offload-launch probe --nvme-path /local_nvme  # also NVMe read/write through DeepSpeed's async_io
  offload-launch probe --quick --json           # seconds; prints the figures as one JSON object
"""


@cli.command("probe", epilog=PROBE_EPILOG)
@click.option("--nvme-path", metavar="DIR", help="Also measure this folder's drive through DeepSpeed's async_io.")
@click.option("--quick", is_flag=True, help="Small sizes: seconds instead of about a minute (for tests).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
@user_errors
def probe_command(nvme_path: str | None, quick: bool, as_json: bool) -> None:
    """Measure this host (memory and PCIe bandwidth, CPU-Adam throughput, NVMe) and cache the figures,
    with the date and the host's identity, where later plans on this host find them."""
    from launcher.inspection import rates as probe
    from launcher.inspection.host import probe_host

    host = probe_host(nvme_path)
    if nvme_path and not host.nvme.aio_usable:
        raise UserInputError(
            "DeepSpeed's async_io op is not usable here (libaio missing): install libaio-dev (Debian/Ubuntu) "
            "or libaio-devel (RHEL), then probe again"
        )
    with stdout_to_stderr():  # DeepSpeed and the JIT compiler print to stdout; --json owns it
        result = probe.run_probe(nvme_path, quick=quick, has_gpu=host.has_gpu, log=lambda m: click.echo(m, err=True))
    path = probe.cache_path(tool_cache_dir())
    probe.save(result, path)
    if as_json:
        click.echo(json.dumps(result.to_json() | {"cache": str(path)}, indent=2))
        return
    click.echo(f"host {result.host_id}, {result.date}; cached in {path}")
    for name, value in result.figures.items():
        unit = "params/s" if name.endswith("params_per_s") else ("FLOP/s" if "flops" in name else "B/s")
        scaled = f"{value / 1e9:,.2f} G{unit}" if unit != "FLOP/s" else f"{value / 1e12:,.3f} TFLOP/s"
        click.echo(f"  {name:<36}{scaled}")
    if result.aio:
        click.echo(f"  best aio settings: {json.dumps(result.aio)}")


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="offload-launch")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
