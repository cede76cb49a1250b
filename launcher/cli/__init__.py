"""The command line: parse, call the core, print. The only package that prints or imports Click; it turns
domain errors (launcher/errors.py) into one line and an exit code (0 ok, 2 bad input, 3 does not fit, 10-18 a
failed smoke check, or the training processes' own code). One module per command; options come from
launcher/settings.py through cli/options.py."""

from launcher.cli.app import cli, main

__all__ = ["cli", "main"]
