"""Learning from finished runs: each training run on a live host records its predicted and measured phases
(passes, update) in the tool cache; a later plan of the same model with as many ranks on the same host scales
each candidate's phases by what runs of that strategy measured against what was predicted (the median of the
most recent RECENT_RUNS).

A factor is a ratio to one version of the step-time model: runs predicted by another version (timing.MODEL_VERSION)
are not used, since their ratios correct errors the current model may no longer make.

The first-principles prediction is never replaced: the plan carries both, says which strategies were
calibrated and from how many runs, and chooses by the calibrated one where there is one.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.files import append_jsonl
from launcher.plan.timing import MODEL_VERSION, StepEstimate

FILE_NAME = "calibration.jsonl"
RECENT_RUNS = 10  # the most recent runs of a strategy on a host that its factors come from
PHASES = ("passes_seconds", "update_seconds")


@dataclass(frozen=True)
class Factors:
    """measured / predicted per phase for one strategy on one host, from `runs` finished runs."""

    passes: float
    update: float
    runs: int

    def to_json(self) -> dict:
        return {"passes": self.passes, "update": self.update, "runs": self.runs}


def record(
    cache_dir: Path, host_id: str, strategy: str, model: str, world: int, predicted: dict, measured: dict
) -> bool:
    """Append one finished run (its phases predicted and measured); False when it measured no phases."""
    if not all(predicted.get(p) and measured.get(p) for p in PHASES):
        return False
    line = {
        "host_id": host_id,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "strategy": strategy,
        "model": model,
        "world_size": world,
        "model_version": MODEL_VERSION,
        "predicted": {p: predicted[p] for p in PHASES},
        "measured": {p: measured[p] for p in PHASES},
    }
    append_jsonl(cache_dir / FILE_NAME, line)
    return True


def load(cache_dir: Path, host_id: str, model: str, world: int) -> dict[str, Factors]:
    """strategy label -> Factors, from the recorded runs of this model with this many ranks on this host (a
    damaged line is skipped): another model or world size shares the rates, not the ratios, and a run predicted by
    another version of the step-time model shares neither."""
    by_strategy: dict[str, list[dict]] = {}
    try:
        lines = (cache_dir / FILE_NAME).read_text().splitlines()
    except OSError:
        return {}
    for text in lines:
        try:
            run = json.loads(text)
            key = (run["host_id"], run["model"], run.get("world_size"), run.get("model_version"))
            if key == (host_id, model, world, MODEL_VERSION):
                by_strategy.setdefault(run["strategy"], []).append(run)
        except (ValueError, KeyError, TypeError):
            continue
    factors = {}
    for strategy, runs in by_strategy.items():
        recent = runs[-RECENT_RUNS:]
        passes, update = (
            statistics.median(r["measured"][phase] / r["predicted"][phase] for r in recent) for phase in PHASES
        )
        factors[strategy] = Factors(passes, update, len(recent))
    return factors


def calibrate(step: StepEstimate, factors: Factors | None) -> StepEstimate:
    """`step` with its calibrated prediction: each phase scaled by its factor (unchanged without factors)."""
    if factors is None:
        return step
    seconds = step.passes_seconds * factors.passes + step.update_seconds * factors.update
    return replace(step, calibrated_step_seconds=seconds, calibration=factors.to_json())
