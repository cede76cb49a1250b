"""`offload-launch recipes`: the bundled recipes, the strategy each plans, and who each is for."""

from __future__ import annotations

import click

from launcher.cli.options import user_errors

RECIPES_EPILOG = """\b
Examples:
  offload-launch recipes
  offload-launch --recipe llama2-7b-1x24g --dry-run
  offload-launch --recipe llama2-7b-1x24g --data ./ds --host-spec this   # on this machine
"""


@click.command("recipes", epilog=RECIPES_EPILOG)
@user_errors
def recipes() -> None:
    """List the bundled recipes, the strategy each plans, and who each is for."""
    from launcher import recipes as bundled
    from launcher import settings
    from launcher.job.planning import build_plan

    for recipe in bundled.available():
        plan = build_plan(settings.layer({}, recipe=recipe.options))
        label = plan.chosen.strategy.label if plan.chosen else "does not fit"
        click.echo(f"{recipe.name:<26} {label:<34} {recipe.summary}")
