"""A finished (or interrupted) run folder drawn as one image: loss, step time against the plan's prediction,
and the plan's figures next to what was measured.

Reads what the run wrote (see rundir.py): OUT/metrics.jsonl (required, one line per optimizer step),
OUT/run.json (written at the end; absent while a run is going or after it was killed), OUT/plan.json and
OUT/run_spec.json (written before launch). matplotlib is imported inside `render_run` and draws on the Agg
canvas directly, so no display and no pyplot state are involved.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import UserInputError
from launcher.job.spec import WARMUP_STEPS_EXCLUDED
from launcher.units import fmt_bytes

FIGURE_INCHES = (12.0, 8.0)
DPI = 100  # 1200 x 800 pixels
RATIO_TICKS = (0.01, 0.1, 0.25, 0.5, 1, 2, 4, 10, 100, 1000, 10_000, 100_000)

# (label, unit, keys in run.json "predicted", keys in "measured"): the first key present wins. The second
# spellings are what runs written before the summary named its tiers per node used (cpu_bytes, nvme_bytes).
COMPARED = (
    ("step time", "s", ("step_seconds",), ("step_seconds",)),
    ("step, calibrated", "s", ("calibrated_step_seconds",), ("step_seconds",)),  # only after finished runs
    ("passes", "s", ("passes_seconds",), ("passes_seconds",)),
    ("update", "s", ("update_seconds",), ("update_seconds",)),
    ("GPU peak / device", "bytes", ("gpu_bytes_per_device",), ("gpu_bytes_per_device",)),
    ("CPU peak / node", "bytes", ("cpu_bytes_per_node", "cpu_bytes"), ("cpu_bytes_per_node",)),
    ("NVMe / node", "bytes", ("nvme_bytes_per_node", "nvme_bytes"), ("nvme_bytes_per_node",)),
)


@dataclass(frozen=True)
class Comparison:
    label: str
    unit: str  # "s" or "bytes"
    predicted: float | None
    measured: float | None

    @property
    def ratio(self) -> float | None:
        if self.predicted and self.measured is not None:
            return self.measured / self.predicted
        return None

    def fmt(self, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.3g} s" if self.unit == "s" else fmt_bytes(value)


@dataclass(frozen=True)
class RunRecord:
    """What the figure shows, read from the run folder."""

    run_dir: Path
    model: str
    strategy: str
    date: str
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    step_seconds: tuple[float, ...]
    planned_steps: int | None
    predicted_step_seconds: float | None
    finished: bool  # run.json exists
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)
    rate_sources: dict = field(default_factory=dict)  # where each rate of the prediction came from
    evals: tuple[tuple[int, float], ...] = ()  # (step, held-out loss) where the run measured one

    @property
    def title(self) -> str:
        return f"{self.model}  |  {self.strategy}  |  {self.date}"


def _read_json(path: Path) -> dict:
    """A run file as a dict; {} when it is absent or unreadable (the figure then leaves its part out)."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    return {}


def _first(mapping: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def read_metrics(path: Path) -> list[dict]:
    """One record per optimizer step, by step. Lines that are not a JSON object with a step are skipped,
    as train.py's own trim_metrics does (a run killed mid-write leaves at most a partial last line)."""
    records: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            record = json.loads(line)
            records[int(record["step"])] = record
    return [records[step] for step in sorted(records)]


def load_run(run_dir: Path) -> RunRecord:
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise UserInputError(
            f"{run_dir} is not a run folder (no metrics.jsonl); pass the --output-dir of a training run"
        )
    metrics = read_metrics(metrics_path)
    if not metrics:
        raise UserInputError(f"{metrics_path} holds no training steps yet; render it once the run has finished a step")
    summary = _read_json(run_dir / "run.json")
    plan = _read_json(run_dir / "plan.json")
    spec = _read_json(run_dir / "run_spec.json")

    model = (plan.get("model") or {}).get("name") or spec.get("model") or run_dir.name
    strategy = (plan.get("strategy") or {}).get("label") or _label_from_summary(summary) or "strategy unknown"
    predicted = summary.get("predicted") or spec.get("predicted") or {}
    predicted_step = _first(predicted, ("step_seconds",)) or _first(plan.get("estimates") or {}, ("step_seconds",))
    measured = summary.get("measured") or {}
    comparisons = tuple(
        Comparison(label, unit, _first(predicted, p_keys), _first(measured, m_keys))
        for label, unit, p_keys, m_keys in COMPARED
        if _first(predicted, p_keys) is not None or p_keys[0] != "calibrated_step_seconds"
    )
    dated = run_dir / "run.json" if summary else metrics_path
    date = dt.datetime.fromtimestamp(dated.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    return RunRecord(
        run_dir=run_dir,
        model=str(model),
        strategy=str(strategy),
        date=date,
        steps=tuple(int(r["step"]) for r in metrics),
        losses=tuple(_number(r.get("loss")) for r in metrics),
        step_seconds=tuple(_number(r.get("step_seconds")) for r in metrics),
        planned_steps=summary.get("steps") or spec.get("steps"),
        predicted_step_seconds=predicted_step,
        finished=bool(summary),
        comparisons=comparisons,
        rate_sources=predicted.get("rate_sources") or (plan.get("rates") or {}).get("sources") or {},
        evals=tuple((int(r["step"]), _number(r["eval_loss"])) for r in metrics if "eval_loss" in r),
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _label_from_summary(summary: dict) -> str | None:
    """The strategy label rebuilt from run.json (strategy.Strategy.label's spelling) when plan.json is gone."""
    if "zero_stage" not in summary:
        return None
    parts = [f"ZeRO-{summary['zero_stage']}"]
    for key, name in (("offload_optimizer", "opt"), ("offload_param", "param")):
        if summary.get(key, "none") != "none":
            parts.append(f"{name}->{summary[key]}")
    return " + ".join(parts)


# ------------------------------------------------------------------------------------------- drawing


def render_run(run_dir: Path, png: Path) -> Path:
    """Draw the run in `run_dir` into `png` (the suffix picks the format: .png, .svg, .pdf) and return it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    record = load_run(Path(run_dir))
    png = Path(png)
    fig = Figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    suffix = png.suffix.lstrip(".").lower()
    if suffix not in canvas.get_supported_filetypes():
        raise UserInputError(f"cannot write an image as '{png.suffix or png.name}'; name the file .png, .svg or .pdf")
    fig.suptitle(record.title, fontsize=13, fontweight="bold")
    top, bottom = fig.subfigures(2, 1, height_ratios=(3, 2))  # laid out apart: long row labels below
    loss_ax, time_ax = top.subplots(1, 2)
    _draw_loss(loss_ax, record)
    _draw_step_time(time_ax, record)
    _draw_comparison(bottom.subplots(), record)
    if record.rate_sources:
        bottom.supxlabel(sources_line(record.rate_sources), fontsize=8, color="dimgray")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format=suffix, dpi=DPI)
    return png


def sources_line(sources: dict) -> str:
    """Where the predicted step's rates came from, one line ("rates: passes measured, pcie nominal, ...")."""
    return "rates: " + ", ".join(f"{name.removesuffix('_per_s')} {source}" for name, source in sorted(sources.items()))


def _step_axis(ax, record: RunRecord) -> None:
    ax.set_xlabel("optimizer step")
    if record.planned_steps and record.steps[-1] < record.planned_steps:
        ax.set_xlim(0, record.planned_steps)  # an unfinished run shows how far it got


def _draw_loss(ax, record: RunRecord) -> None:
    marker = "." if len(record.steps) < 50 else ""
    ax.plot(record.steps, record.losses, color="tab:blue", linewidth=1.5, marker=marker, label="training")
    finite = [x for x in record.losses if math.isfinite(x)]
    title = "training loss" + (f"  {finite[0]:.4g} -> {finite[-1]:.4g}" if finite else "")
    if record.evals:  # the held-out loss, where the run measured it
        steps, losses = zip(*record.evals, strict=True)
        ax.plot(steps, losses, color="tab:red", linewidth=1.5, marker="o", label="held-out")
        ax.legend(loc="upper right", fontsize="small")
        title += f"  |  held-out {losses[-1]:.4g}"
    ax.set_title(title)
    _step_axis(ax, record)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)


def _draw_step_time(ax, record: RunRecord) -> None:
    ax.plot(record.steps, record.step_seconds, color="tab:orange", linewidth=1.5, label="measured")
    finite = [s for s in record.step_seconds if math.isfinite(s)]
    measured = finite[WARMUP_STEPS_EXCLUDED:] or finite
    if measured:
        median = statistics.median(measured)  # as run.json's measured step time (train.py)
        ax.axhline(median, color="tab:orange", linestyle=":", label=f"median after warm-up {median:.3g} s")
    if record.predicted_step_seconds:
        ax.axhline(
            record.predicted_step_seconds,
            color="tab:green",
            linestyle="--",
            label=f"predicted {record.predicted_step_seconds:.3g} s",
        )
    ax.set_title("step time")
    _step_axis(ax, record)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)


def _draw_comparison(ax, record: RunRecord) -> None:
    """Measured / predicted per figure: a bar from 1 (as planned) to the ratio on a log axis, so 0.5x and
    2x are equally far off; each row is labelled with both values."""
    rows = [c for c in record.comparisons if c.predicted or c.measured]  # both 0: a tier the run did not use
    ax.set_title("measured / predicted" + ("" if record.finished else "  (no run.json yet: the run has not finished)"))
    if not rows:
        ax.text(0.5, 0.5, "no predictions recorded for this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ratios = [c.ratio for c in rows]
    known = [r for r in ratios if r]
    low, high = min([0.5, *known]) / 1.5, max([2.0, *known]) * 1.5
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    for y, (c, ratio) in enumerate(zip(rows, ratios, strict=True)):
        if ratio:
            color = "tab:green" if 0.8 <= ratio <= 1.25 else "tab:orange" if 0.5 <= ratio <= 2 else "tab:red"
            ax.barh(y, ratio - 1.0, left=1.0, height=0.6, color=color)
            ax.text(
                ratio * (1.04 if ratio >= 1 else 1 / 1.04),
                y,
                f"{ratio:.2f}x",
                va="center",
                ha="left" if ratio >= 1 else "right",
                fontsize=10,
            )
        else:
            ax.text(1.04, y, "no prediction" if c.measured else "not measured", va="center", color="gray")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xticks([t for t in RATIO_TICKS if low <= t <= high], minor=False)
    ax.set_xticks([], minor=True)
    ax.xaxis.set_major_formatter(lambda value, _pos: f"{value:g}x")
    labels = [f"{c.label}\n{c.fmt(c.measured)} measured / {c.fmt(c.predicted)} predicted" for c in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("measured / predicted (log scale; 1 = as planned)")
    ax.grid(axis="x", alpha=0.3)
