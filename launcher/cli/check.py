"""`offload-launch check FILE --model M`: lint an existing ds_config for a model and a host."""

from __future__ import annotations

import click

from launcher.cli.options import ToolError, echo_json, option, typed_values, user_errors

CHECK_EPILOG = """\b
Examples:
  offload-launch check ds_config.json --model meta-llama/Llama-2-7b                # for this machine
  offload-launch check ds_config.json --model meta-llama/Llama-2-70b-hf --host-spec 1x-a100-80g --nvme-path /nvme
  offload-launch check ds_config.json --model ./my-model --num-gpus 8 --json
"""


@click.command("check", epilog=CHECK_EPILOG)
@click.argument("config_file", metavar="FILE", type=click.Path(dir_okay=False))
@option("model", required=True, help="The model the config is for.")
@option("trust_remote_code")
@option("host_spec", type=str, help="Check against a described host instead of this machine.")
@option("nvme_path", help="The NVMe folder the config's offload would use (for its free space).")
@option("num_gpus")
@option("hostfile", help="DeepSpeed hostfile (node count).")
@option("seq_len", help="Tokens per sequence, for activation memory [default: model max, <= 2048].")
@option("lora", help="The config is for a LoRA run: check the adapter traps too (docs/adapters.md).")
@option("lora_rank")
@option("lora_target")
@option("json", help="Print the findings as one JSON object.")
@click.pass_context
@user_errors
def check(ctx: click.Context, config_file: str, **values) -> None:
    """Lint an existing ds_config for a model and host, as DeepSpeed reads it: errors for what DeepSpeed refuses
    or misreads (unknown keys in its config models, with the nearest valid one; type errors with their JSON path;
    fractional sizes; swap buffers smaller than the largest parameter; batch arithmetic; offload that will not
    fit this host's RAM or disk), warnings for what it silently ignores (keys it never reads, renamed aio keys,
    keys the configured stage does not use), notes for values it reads differently from how they are written
    (1e9 read as the integer 1000000000). Exit 0 when there is no error, 2 otherwise."""
    from launcher.job.check import check_config

    result = check_config(config_file, typed_values(ctx, values))
    if values["json"]:
        echo_json(result.to_json())
    else:
        for finding in result.findings:
            click.echo(str(finding))
        plan = result.plan
        click.echo(
            f"{config_file}: {result.errors} error(s), {result.warnings} warning(s), {result.notes} note(s) for "
            f"{plan.model.name} at world size {plan.world_size} on {plan.host.source} host"
        )
    if result.errors:
        raise ToolError(f"{config_file} has {result.errors} error(s); see above", 2)
