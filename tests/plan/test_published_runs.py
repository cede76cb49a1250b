"""The step-time model against public, measured GPU runs (tests/plan/published_runs.yaml: each with its source,
quote and the fields it states). Every run the planner can plan (a causal LM whose config is in
published_models/, every field that sets the step time stated) is planned as a described host, pinned to the
run's strategy, and its predicted step compared with the measured one; runs measured on the same machine are
compared as ratios too. One model explains them all: nothing here is fitted per run.

`python -m tests.plan.test_published_runs` prints the table docs/planning.md shows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launcher import settings
from launcher.job.planning import build_plan

HERE = Path(__file__).parent
RUNS = yaml.safe_load((HERE / "published_runs.yaml").read_text())["runs"]
ABSOLUTE_BAND = (0.67, 1.5)  # measured / predicted step time of a fully stated run
RATIO_BAND = (0.75, 1.33)  # (measured a / measured b) / (predicted a / predicted b), runs on one machine
# Stated fields a described host cannot hold, where the model cannot see them (the measured step includes them).
UNPLANNED = ("notes",)


def plannable(run: dict) -> bool:
    return bool(run.get("config")) and run["measured"]["step_seconds"] is not None


def host_yaml(run: dict, folder: Path) -> Path:
    gpus, cpu, pcie = run["gpus"], run.get("cpu") or {}, run.get("pcie") or {}
    lines = [
        f"gpus: {{count: {gpus['per_node']}, memory: {gpus['memory_gib']}GiB, name: {gpus['name']!r}}}",
        f"cpu_memory: {cpu.get('memory_gib') or 1024}GiB",
        f"cpu_cores: {cpu.get('cores') or 32}",
    ]
    if pcie:
        lines.append(f"pcie: {{generation: {pcie['gen']}, width: {pcie['lanes'] or 16}}}")
    if (run.get("nodes") or 1) > 1:  # the nodes' network is not stated: the plan's nominal figure (network.py)
        lines.append(f"nodes: {run['nodes']}")
    path = folder / f"{run['id']}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def predicted_step_seconds(run: dict, folder: Path) -> float:
    """The plan's step time for the run as it was configured (strategy pinned), on its described host."""
    typed = {
        "model": str(HERE / run["config"]),
        "host_spec": str(host_yaml(run, folder)),
        "num_gpus": run["gpus"]["per_node"],
        "zero_stage": str(max(1, run["zero_stage"])),
        "offload_optimizer": run["offload_optimizer"],
        "offload_param": run["offload_param"],
        "micro_batch": run["micro_batch"],
        "grad_accum": run["grad_accum"],
        "seq_len": run["seq_len"],
        "precision": run["precision"],
        "activation_checkpointing": bool(run["activation_checkpointing"]),
        "allow_long_seq": True,
    }
    plan = build_plan(settings.layer(typed))
    candidate = next(c for c in plan.candidates if c.strategy.zero_stage == int(typed["zero_stage"]))
    return candidate.timing.step_seconds


@dataclass(frozen=True)
class Row:
    id: str
    group: str | None
    fully_stated: bool
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted


def rows(folder: Path) -> list[Row]:
    return [
        Row(
            run["id"],
            run.get("group"),
            run["fully_stated"],
            run["measured"]["step_seconds"],
            predicted_step_seconds(run, folder),
        )
        for run in RUNS
        if plannable(run)
    ]


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> list[Row]:
    return rows(tmp_path_factory.mktemp("hosts"))


def test_the_collection_is_what_the_issue_asks_for():
    """At least six public measured setups, with and without offload, every one with its source and quote."""
    assert len(RUNS) >= 6
    assert {"none", "cpu"} <= {run["offload_optimizer"] for run in RUNS}
    for run in RUNS:
        assert run["source"].startswith("https://") and run["quote"], run["id"]
        assert run["fully_stated"] in (True, False)


def test_fully_stated_runs_come_true(table):
    stated = [row for row in table if row.fully_stated]
    assert len(stated) >= 4
    misses = [
        f"{row.id}: measured {row.measured:.3g} s, predicted {row.predicted:.3g} s"
        for row in stated
        if not ABSOLUTE_BAND[0] <= row.ratio <= ABSOLUTE_BAND[1]
    ]
    assert not misses, misses


def same_machine_pairs(table: list[Row]) -> list[tuple[Row, Row]]:
    by_group: dict[str, list[Row]] = {}
    for row in table:
        if row.group and row.fully_stated:
            by_group.setdefault(row.group, []).append(row)
    return [pair for group in by_group.values() for pair in itertools.combinations(group, 2)]


def test_ratios_between_runs_on_one_machine_come_true(table):
    pairs = same_machine_pairs(table)
    assert pairs
    misses = []
    for a, b in pairs:
        ratio = (a.measured / b.measured) / (a.predicted / b.predicted)
        if not RATIO_BAND[0] <= ratio <= RATIO_BAND[1]:
            misses.append(
                f"{a.id} / {b.id}: measured {a.measured / b.measured:.2f}, predicted {a.predicted / b.predicted:.2f}"
            )
    assert not misses, misses


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        table_rows = rows(Path(folder))
    print("| run | fully stated | measured s/step | predicted s/step | measured / predicted |")
    print("|---|---|---|---|---|")
    for row in table_rows:
        stated = "yes" if row.fully_stated else "no"
        print(f"| {row.id} | {stated} | {row.measured:.3g} | {row.predicted:.3g} | {row.ratio:.2f} |")
    for a, b in same_machine_pairs(table_rows):
        print(
            f"ratio {a.id} / {b.id}: measured {a.measured / b.measured:.2f}, predicted {a.predicted / b.predicted:.2f}"
        )
