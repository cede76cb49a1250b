"""`offload-launch report RUN`: a run folder as an image."""

from __future__ import annotations

from pathlib import Path

import click

from launcher.cli.options import user_errors

REPORT_EPILOG = """\b
Examples:
  offload-launch report runs/demo                  # writes runs/demo/report.png
  offload-launch report runs/demo --out demo.svg
"""


@click.command("report", epilog=REPORT_EPILOG)
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False))
@click.option("--out", metavar="PNG", help="Image to write (.png, .svg or .pdf) [default: RUN/report.png].")
@user_errors
def report(run_dir: str, out: str | None) -> None:
    """Render a run folder as an image: loss and step time over the steps, the plan's predicted step time,
    and measured / predicted memory and speed."""
    from launcher.job import rundir
    from launcher.views import run_chart

    if out is None:
        rundir.claim_name(Path(run_dir), rundir.REPORT_FILE)  # only ever replaces a report.png it wrote itself
    path = run_chart.render_run(Path(run_dir), Path(out) if out else Path(run_dir) / rundir.REPORT_FILE)
    click.echo(f"wrote {path}")
