"""The command line: parse, call the pure core, print. The only module that reads the environment,
prints, and turns domain errors into exit codes (0 ok, 2 bad input, 3 does not fit)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from launcher import __version__
from launcher.errors import DoesNotFit, OffloadLaunchError

RUN_EPILOG = """\b
Examples:
  offload-launch --model meta-llama/Llama-2-7b --dry-run
  offload-launch --model ./my-model-dir --dry-run --json --host-spec recipes/hosts/1x-a100-80g.yaml --config-out ds.json
  offload-launch --model meta-llama/Llama-2-70b-hf --dry-run --host-spec recipes/hosts/1x-h100-80g.yaml
  offload-launch --model mistralai/Mistral-7B --dry-run --zero-stage 3 --offload-optimizer cpu
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


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=RUN_EPILOG)
@click.version_option(__version__, prog_name="offload-launch")
def cli() -> None:
    """Plan, configure and launch DeepSpeed fine-tuning of models bigger than your GPU.

    `offload-launch --model M --dry-run` is short for `offload-launch run --model M --dry-run`:
    it sizes the model exactly, reads the host (or a described one), picks the ZeRO stage and
    offload tiers with the decision framework, and prints the plan and a validated ds_config.
    """


def plan_options(func):
    """Options shared by every command that makes a plan."""
    options = [
        click.option(
            "--model",
            "model_spec",
            required=True,
            metavar="ID|DIR",
            help="Hugging Face hub id (e.g. meta-llama/Llama-2-7b) or a local directory with config.json.",
        ),
        click.option("--trust-remote-code", is_flag=True, help="Allow model code shipped with the checkpoint."),
        click.option(
            "--host-spec",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="Plan for a described host (YAML/JSON) instead of probing this machine.",
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


def build_plan(opts: dict):
    """Inspect the model and host, then plan. Heavy imports stay inside so `--help` is instant."""
    from launcher.host import load_host_spec, probe_host, with_nvme_path
    from launcher.model import inspect_model
    from launcher.plan import Workload, make_plan

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
    model = inspect_model(opts["model_spec"], trust_remote_code=opts["trust_remote_code"])
    return make_plan(model, host, workload)


@cli.command("run", epilog=RUN_EPILOG)
@plan_options
@click.option("--dry-run", is_flag=True, help="Print the plan and the ds_config; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object (see README, 'JSON contract').")
@click.option(
    "--config-out", type=click.Path(dir_okay=False, writable=True), metavar="PATH", help="Write the ds_config to PATH."
)
@user_errors
def run(dry_run: bool, as_json: bool, config_out: str | None, **opts) -> None:
    """Plan (and, with --data, train). Without --data this prints the plan: a dry run."""
    from launcher import dsconfig, report

    plan = build_plan(opts)
    ds_config = None
    if plan.chosen is not None:
        ds_config = dsconfig.render(plan)
        dsconfig.validate(ds_config, plan.world_size)
    if as_json:
        click.echo(json.dumps(report.plan_json(plan, ds_config), indent=2))
    else:
        click.echo(report.plan_text(plan, ds_config))
    if plan.chosen is None:
        raise DoesNotFit(
            f"{plan.model.name} does not fit this host with any allowed strategy; see the candidates table"
        )
    if config_out:
        Path(config_out).write_text(json.dumps(ds_config, indent=2) + "\n")
        if not as_json:
            click.echo(f"\nwrote {config_out}")


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="offload-launch")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
