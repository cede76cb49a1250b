"""Smoke mode: prove in minutes that a training configuration works before the real run.

`offload-launch ... --smoke` runs the planned configuration for a few optimizer steps and reports named
checks. With `--smoke-layers K` the model keeps its real shapes (hidden size, heads, vocabulary, so the
largest tensor, the buckets and the kernels are the real ones) but only K transformer layers, with random
weights, so a 70B configuration fits a CI runner. Each check has its own exit code.

The checks, in order (the first that fails decides the exit code):
  config        the ds_config renders and passes the JSON Schema and DeepSpeed's own models        exit 10
  data          the data loads, tokenizes and packs into at least one block per rank             exit 11
  engine        DeepSpeed built the planned ZeRO stage and offload devices (and DeepSpeedCPUAdam) exit 12
  loss          every loss is finite and the last is below the first (one batch, seen again); fp16's
                first loss-scale calibration skips are allowed, later skips fail                 exit 13
  memory        measured peak memory per tier / the plan's prediction <= --smoke-memory-tolerance exit 14
  checkpoint    a checkpoint saves, and loading it restores the saved weights exactly           exit 15
  nvme_cleanup  the run's NVMe swap folder is gone at the end                                    exit 16
  timeout       the whole run finished within --smoke-timeout                                   exit 17
  run           the training processes exited cleanly                                           exit 18
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher import settings
from launcher.errors import UserInputError
from launcher.job.rundir import SMOKE_RESULT

CHECKS = ("config", "data", "engine", "loss", "memory", "checkpoint", "nvme_cleanup", "timeout", "run")
EXIT_CODES = {name: 10 + i for i, name in enumerate(CHECKS)}
RESULT_FILE = SMOKE_RESULT  # written by rank 0 of the smoke run: the checks made inside training
DEFAULT_STEPS = 3
DEFAULT_TIMEOUT_MINUTES = settings.declaration("smoke_timeout").default
DEFAULT_MEMORY_TOLERANCE = settings.declaration("smoke_memory_tolerance").default  # the planner's error band


def default_lr(hidden_size: int) -> float:
    """The smoke run's constant learning rate when --lr is not given: 1e-3 up to a width of 256, then
    shrinking as 1/width (muP's Adam rule for hidden matrices, Yang et al. 2022). The check is that the
    machinery learns one batch it sees again, not the schedule: a Llama-2-7B layer at 1e-3 memorised the
    batch in one step and overshot in the next (loss 11.5 -> 0.03 -> 17.3, measured here)."""
    return 1e-3 * min(1.0, 256 / max(1, hidden_size))


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not run (an earlier failure made it meaningless)
    message: str
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return {True: "pass", False: "FAIL", None: "skip"}[self.passed]


@dataclass
class SmokeReport:
    model: str
    strategy: str | None
    layers: int | None  # transformer layers kept (None: the whole model)
    full_model: dict | None  # what the full model needs on this host, when --smoke-layers truncated it
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def failed(self) -> Check | None:
        failures = [c for c in self.checks if c.passed is False]
        return min(failures, key=lambda c: CHECKS.index(c.name)) if failures else None

    @property
    def exit_code(self) -> int:
        failed = self.failed
        return EXIT_CODES[failed.name] if failed else 0

    def to_json(self) -> dict:
        failed = self.failed
        return {
            "passed": failed is None,
            "exit_code": self.exit_code,
            "failed_check": failed.name if failed else None,
            "model": self.model,
            "strategy": self.strategy,
            "layers": self.layers,
            "full_model": self.full_model,
            "checks": [asdict(c) | {"status": c.status} for c in self.checks],
        }


def read_checks(out: Path) -> list[Check]:
    """The checks the training processes recorded (empty when they died before writing them)."""
    path = out / RESULT_FILE
    try:
        return [Check(**c) for c in json.loads(path.read_text())["checks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


# ------------------------------------------------------------------------------------------ truncation


def truncate_model(model_spec: str, layers: int, dest: Path, trust_remote_code: bool = False) -> tuple[Path, int]:
    """Write the model's config with only `layers` transformer layers to `dest` (no weights: training
    starts from a random initialization). Per-layer lists (e.g. Qwen's `layer_types`) are cut to match.
    Returns (dest, the model's full layer count)."""
    from launcher.inspection.model_config import cut_to_layers, load_config, resolve_config_dir

    location, _source, _name = resolve_config_dir(model_spec)
    config = load_config(location, trust_remote_code)
    full = getattr(config, "num_hidden_layers", None)
    if not isinstance(full, int):
        raise UserInputError(f"--smoke-layers: {model_spec} has no num_hidden_layers to cut; run --smoke without it")
    if not 1 <= layers < full:
        raise UserInputError(f"--smoke-layers {layers}: pass 1 to {full - 1} ({model_spec} has {full} layers)")
    cut_to_layers(config, layers)
    dest.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(dest)
    return dest, full


def tokenizer_source(model_spec: str, tokenizer: str | None) -> str:
    """--tokenizer when given; else the model itself: its folder, or its hub id (an alias such as
    meta-llama/Llama-2-7b resolved to the real repository)."""
    from launcher.inspection.model_config import bundled_aliases

    return tokenizer or bundled_aliases().get(model_spec, model_spec)
