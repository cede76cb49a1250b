"""`offload-launch probe`: measure this host's rates and cache them for later plans."""

from __future__ import annotations

import json

import click

from launcher.cli.options import echo_json, option, stdout_to_stderr, user_errors, warn

PROBE_EPILOG = """\b
Examples:
  offload-launch probe                          # CPU bandwidth, CPU-Adam, PCIe (with a GPU); about a minute
  offload-launch probe --nvme-path /local_nvme  # also NVMe read/write through DeepSpeed's async_io
  offload-launch probe --quick --json           # seconds; prints the figures as one JSON object
  offload-launch probe --model meta-llama/Llama-2-7b --tokens 8192
                                                # GPU matmuls at that model's shapes, 8192 rows
"""


@click.command("probe", epilog=PROBE_EPILOG)
@option("nvme_path", help="Also measure this folder's drive through DeepSpeed's async_io.")
@click.option("--quick", is_flag=True, help="Small sizes: seconds instead of about a minute (for tests).")
@click.option(
    "--model",
    "model",
    metavar="ID|DIR",
    default=None,
    help="With a GPU: time bf16 matmuls at this model's shapes (hidden x hidden, hidden x intermediate). "
    "Without it, a fixed set of Llama shapes (hidden 1024, 4096, 5120, 8192) is timed.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Rows of the timed GPU matmuls: tokens per micro-batch (micro-batch x sequence length).",
)
@option("json", help="Print the figures as one JSON object.")
@user_errors
def probe(nvme_path: str | None, quick: bool, model: str | None, tokens: int, **values) -> None:
    """Measure this host (memory and PCIe bandwidth, CPU-Adam throughput, GPU bf16 matmuls, NVMe) and cache
    the figures, with the date and the host's identity, where later plans on this host find them."""
    from launcher.job import measuring_process

    with stdout_to_stderr():  # DeepSpeed and the JIT compiler print to stdout; --json owns it
        result, path = measuring_process.probe(nvme_path, quick=quick, log=warn, model=model, tokens=tokens)
    if values["json"]:
        echo_json(result.to_json() | {"cache": str(path)})
        return
    click.echo(f"host {result.host_id}, {result.date}; cached in {path}")
    for name, value in result.figures.items():
        unit = "params/s" if name.endswith("params_per_s") else ("FLOP/s" if "flops" in name else "B/s")
        scaled = f"{value / 1e9:,.2f} G{unit}" if unit != "FLOP/s" else f"{value / 1e12:,.3f} TFLOP/s"
        click.echo(f"  {name:<36}{scaled}")
    matmul = result.details.get("gpu_matmul")
    if matmul:
        shapes = f"(hidden, intermediate) {matmul['shapes']}"
        click.echo(f"  GPU matmuls: {matmul['tokens']:,} rows, {shapes}, shapes from {matmul['shapes_from']}")
    if result.aio:
        click.echo(f"  best aio settings: {json.dumps(result.aio)}")
