"""The `offload-launch` command group: `offload-launch --model M ...` is `offload-launch run --model M ...`."""

from __future__ import annotations

import signal
import sys

import click

from launcher import __version__, stops
from launcher.cli.check import check
from launcher.cli.probe import probe
from launcher.cli.recipes import recipes
from launcher.cli.report import report
from launcher.cli.run import RUN_EPILOG, run


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


for command in (run, check, report, recipes, probe):
    cli.add_command(command)


def main() -> None:
    """Console-script entry point. Exit codes as docs/troubleshooting.md's table says, in every phase: a
    Ctrl-C exits 130 and a SIGTERM 143 with one line (never Click's "Aborted!" and exit 1), after the
    cleanup on the way out (the output folder's lock released, no partial cache file left)."""
    stops.install()
    try:
        code = cli.main(prog_name="offload-launch", standalone_mode=False)
    except click.exceptions.Abort as abort:
        if isinstance(abort.__context__, KeyboardInterrupt):
            _interrupted(signal.SIGINT)
        click.echo("Aborted!", err=True)  # end of input at a prompt
        sys.exit(1)
    except KeyboardInterrupt:
        _interrupted(signal.SIGINT)
    except stops.Terminated:
        _interrupted(signal.SIGTERM)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    sys.exit(code if isinstance(code, int) else 0)  # --help and --version return their exit code


def _interrupted(signum: int) -> None:
    click.echo(f"\ninterrupted ({signal.Signals(signum).name})", err=True)
    sys.exit(128 + signum)
