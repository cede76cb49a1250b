"""The `check` workflow: lint an existing ds_config for a model and a host, without running anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher import settings as settings_schema
from launcher.config.final import DUPLICATE_FIX, read_user_config, user_pins
from launcher.job.planning import build_plan
from launcher.plan.planner import Plan

BATCH_PINS = ("micro_batch", "grad_accum")  # what the config fixes for the memory estimate it is checked against


@dataclass(frozen=True)
class CheckResult:
    file: str
    plan: Plan
    findings: list  # launcher.config.lint.Finding, errors, warnings and notes in the order found

    @property
    def errors(self) -> int:
        return sum(f.level == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.level == "warning" for f in self.findings)

    @property
    def notes(self) -> int:
        return sum(f.level == "note" for f in self.findings)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "world_size": self.plan.world_size,
            "errors": self.errors,
            "warnings": self.warnings,
            "notes": self.notes,
            "findings": [f.to_json() for f in self.findings],
        }


def check_config(config_file: str, typed: Mapping[str, object]) -> CheckResult:
    """The findings for `config_file` against the plan for the typed model/host options (the config's own
    micro-batch and accumulation size the activations)."""
    from launcher.config import lint

    user = read_user_config(config_file, duplicates_ok=True)
    pins = {k: v for k, v in user_pins(user).items() if k in BATCH_PINS}
    plan = build_plan(settings_schema.layer(typed, pins=pins))
    repeated = [lint.Finding("error", d.path, f"duplicate key ({d.where}); {DUPLICATE_FIX}") for d in user.duplicates]
    # the rest is linted as json read it (the last of each repeated key); DeepSpeed's own parse, which runs
    # only on a config with no error, is skipped: it would refuse the file for the repeat alone
    return CheckResult(
        config_file, plan, repeated + lint.lint(user.config, plan, plan.world_size, deepspeed=not repeated)
    )
