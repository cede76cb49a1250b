"""`render_run`: a run folder (the files train.py and job.py write) drawn as an image."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.workload import Workload
from launcher.views.run_chart import DPI, FIGURE_INCHES, load_run, render_run, sources_line
from tests.helpers import REPO, host_path

STEPS = 30
PREDICTED_STEP_SECONDS = 1.5


def write_run(out: Path, model_dir: Path, *, steps: int = STEPS, finished: bool = True, gpu: bool = False) -> Path:
    """A run folder as `offload-launch run --data` leaves it: plan.json (the --json contract), run_spec.json
    with the plan's predictions, metrics.jsonl one line per step, and run.json at the end."""
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(
        inspect_model(str(model_dir)),
        (h := load_host_spec(host_path("cpu-only"))),
        Workload(seq_len=128),
        resolve_rates(h),
    )
    (out / "plan.json").write_text(json.dumps(plan.to_json(None)))
    memory = plan.chosen.memory
    predicted = {
        "step_seconds": PREDICTED_STEP_SECONDS,
        "tokens_per_s": 128 / PREDICTED_STEP_SECONDS,
        "gpu_bytes_per_device": memory.gpu_bytes_per_device,
        "cpu_bytes_per_node": memory.cpu_bytes,
        "nvme_bytes_per_node": memory.nvme_bytes,
    }
    spec = {"output_dir": str(out), "model": str(model_dir), "data": "train.jsonl", "seq_len": 128}
    (out / "run_spec.json").write_text(json.dumps(spec | {"steps": STEPS, "predicted": predicted}))
    lines = []
    for step in range(1, steps + 1):
        seconds = 2.5 if step == 1 else 1.2 + 0.1 * math.sin(step)  # the warm-up step is slow
        record = {
            "step": step,
            "loss": 6.5 * math.exp(-step / 15) + 3.0,
            "lr": 1e-3,
            "tokens": 128,
            "tokens_per_s": 128 / seconds,
            "step_seconds": seconds,
            "cpu_peak_rss_bytes": 500_000_000 + step * 1_000_000,
            "skipped_steps": 0,
        }
        if gpu:
            record["gpu_peak_bytes"] = 7_000_000_000
        lines.append(json.dumps(record))
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if finished:
        measured = {
            "step_seconds": 1.2,
            "tokens_per_s": 128 / 1.2,
            "cpu_bytes_per_node": 530_000_000,
            "nvme_bytes_per_node": 0,
        }
        if gpu:
            measured["gpu_bytes_per_device"] = 7_500_000_000
        ratios = {k: measured[k] / predicted[k] for k in measured if measured[k] and predicted.get(k)}
        summary = {
            "optimizer": "DeepSpeedCPUAdam",
            "world_size": 1,
            "zero_stage": plan.chosen.strategy.zero_stage,
            "offload_optimizer": plan.chosen.strategy.offload_optimizer,
            "offload_param": plan.chosen.strategy.offload_param,
            "steps": STEPS,
            "first_loss": 9.5,
            "final_loss": 3.9,
            "wall_seconds": 40.0,
            "tokens_per_s": measured["tokens_per_s"],
            "peak_cpu_rss_bytes": 530_000_000,
            "predicted": predicted,
            "measured": measured,
            "ratios": ratios,
            "final_dir": str(out / "final"),
        }
        (out / "run.json").write_text(json.dumps(summary))
    return out


def read_png(path: Path):
    from matplotlib.image import imread

    return imread(path)


def test_a_finished_run_renders_a_plausible_image(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir)
    png = render_run(run, tmp_path / "out" / "report.png")  # missing parent folders are made
    assert png == tmp_path / "out" / "report.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = read_png(png)
    height, width = image.shape[:2]
    assert (width, height) == (FIGURE_INCHES[0] * DPI, FIGURE_INCHES[1] * DPI)
    rgb = image[..., :3]
    ink = (rgb.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert 0.02 < ink < 0.6, ink
    assert len({tuple(p) for p in rgb.reshape(-1, 3)[::97].round(2).tolist()}) > 20  # lines, bars and text


def test_the_image_follows_the_data(tmp_path, tiny_llama_dir):
    a = render_run(write_run(tmp_path / "a", tiny_llama_dir), tmp_path / "a.png")
    b = render_run(write_run(tmp_path / "b", tiny_llama_dir, steps=10), tmp_path / "b.png")
    assert (read_png(a) != read_png(b)).any()


def test_what_the_figure_shows(tmp_path, tiny_llama_dir):
    record = load_run(write_run(tmp_path / "run", tiny_llama_dir, gpu=True))
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["strategy"]["label"] in record.title and str(tiny_llama_dir) in record.title
    assert record.steps == tuple(range(1, STEPS + 1)) and record.finished
    assert record.predicted_step_seconds == PREDICTED_STEP_SECONDS
    by_label = {c.label: c for c in record.comparisons}
    assert by_label["step time"].ratio == pytest.approx(1.2 / 1.5)
    assert by_label["GPU peak / device"].measured == 7_500_000_000
    assert by_label["NVMe / node"].predicted == 0


def test_an_unfinished_run_renders_from_its_metrics(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir, steps=5, finished=False)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 6, "loss": 4.')  # a run killed mid-write
    record = load_run(run)
    assert not record.finished and record.steps == (1, 2, 3, 4, 5) and record.planned_steps == STEPS
    assert record.predicted_step_seconds == PREDICTED_STEP_SECONDS  # from run_spec.json
    assert {c.measured for c in record.comparisons} == {None}
    assert render_run(run, tmp_path / "partial.png").stat().st_size > 10_000


def test_resumed_steps_are_drawn_in_order_once(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir, steps=4)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[2], lines[0], lines[1], lines[3], lines[2]]) + "\n")
    assert load_run(run).steps == (1, 2, 3, 4)


def test_an_older_run_without_plan_or_step_prediction(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir)
    (run / "plan.json").unlink()
    (run / "run_spec.json").unlink()
    summary = json.loads((run / "run.json").read_text())
    summary["predicted"] = {"gpu_bytes_per_device": 8_041_778, "cpu_bytes": 1_641_359_922, "nvme_bytes": 0}
    (run / "run.json").write_text(json.dumps(summary))
    record = load_run(run)
    assert record.predicted_step_seconds is None and record.model == "run"
    assert record.strategy.startswith(f"ZeRO-{summary['zero_stage']}")
    assert {c.label: c.predicted for c in record.comparisons}["CPU peak / node"] == 1_641_359_922
    assert render_run(run, tmp_path / "old.png").exists()


def test_a_folder_without_metrics_is_not_a_run(tmp_path):
    with pytest.raises(UserInputError, match="is not a run folder.*--output-dir"):
        render_run(tmp_path, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_a_run_without_steps(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir, finished=False)
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(UserInputError, match="no training steps"):
        render_run(run, tmp_path / "x.png")


def test_an_unknown_image_suffix(tmp_path, tiny_llama_dir):
    run = write_run(tmp_path / "run", tiny_llama_dir)
    with pytest.raises(UserInputError, match=r"'\.txt'.*\.png"):
        render_run(run, tmp_path / "report.txt")


def test_svg_by_suffix(tmp_path, tiny_llama_dir):
    svg = render_run(write_run(tmp_path / "run", tiny_llama_dir), tmp_path / "report.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_no_display_and_no_pyplot(tmp_path, tiny_llama_dir):
    """A headless machine set to a GUI backend still renders: Agg is used directly, pyplot
    (which would pick a GUI backend) is never imported."""
    run = write_run(tmp_path / "run", tiny_llama_dir)
    code = (
        "import sys; from pathlib import Path; from launcher.views.run_chart import render_run; "
        f"render_run(Path({str(run)!r}), Path({str(tmp_path / 'r.png')!r})); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"} | {"MPLBACKEND": "tkagg"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_the_phases_the_calibrated_step_and_the_rates_sources(tmp_path, tiny_llama_dir):
    """run.json written by this version: each phase compared, the calibrated step when finished runs calibrated
    the plan, and the source of every rate under the comparison."""
    out = write_run(tmp_path / "run", tiny_llama_dir)
    summary = json.loads((out / "run.json").read_text())
    summary["predicted"] |= {
        "passes_seconds": 1.0,
        "update_seconds": 0.5,
        "calibrated_step_seconds": 1.25,
        "rate_sources": {"passes": "measured", "pcie_bytes_per_s": "nominal"},
    }
    summary["measured"] |= {"passes_seconds": 0.9, "update_seconds": 0.3}
    (out / "run.json").write_text(json.dumps(summary))
    record = load_run(out)
    by_label = {c.label: c for c in record.comparisons}
    assert by_label["passes"].ratio == pytest.approx(0.9) and by_label["update"].ratio == pytest.approx(0.6)
    assert by_label["step, calibrated"].ratio == pytest.approx(1.2 / 1.25)
    assert sources_line(record.rate_sources) == "rates: passes measured, pcie_bytes nominal"
    render_run(out, tmp_path / "run.png")


def test_without_finished_runs_there_is_no_calibrated_row(tmp_path, tiny_llama_dir):
    labels = {c.label for c in load_run(write_run(tmp_path / "run", tiny_llama_dir)).comparisons}
    assert "step, calibrated" not in labels and "step time" in labels
