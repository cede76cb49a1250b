"""Progress: the progress bar, OUT/metrics.jsonl (one line per optimizer step) and the run summary (OUT/run.json).

Everything here but `Progress` is plain arithmetic and file writing: the trainer measures, this module records.
"""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from launcher.files import append_jsonl
from launcher.job.spec import WARMUP_STEPS_EXCLUDED, RunSpec
from launcher.rank.export import FINAL_DIR

# measured / predicted ratios in run.json, for the figures the plan predicts and the run measures
RATIO_KEYS = (
    "step_seconds",
    "passes_seconds",
    "update_seconds",
    "gpu_bytes_per_device",
    "cpu_bytes_per_node",
    "nvme_bytes_per_node",
)


def peak_rss_bytes() -> int:
    """This rank's peak resident set, plus its live child processes' peaks: ZenFlow's optimizer worker is a child
    (deepspeed/runtime/zenflow/zenflow_utils.py `start_optimizer_process`) that holds Adam's state."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    children = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            children += _high_water_mark(child)
    return own + children


def _high_water_mark(process: psutil.Process) -> int:
    """A live process's peak resident set: VmHWM in /proc/PID/status (proc(5)), else its resident set now."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return process.memory_info().rss


def node_count(world: int, environ: Mapping[str, str]) -> int:
    """Nodes in the run. DeepSpeed's launcher exports CROSS_SIZE (nodes) and LOCAL_SIZE (ranks on this node)."""
    return int(environ.get("CROSS_SIZE") or max(1, world // int(environ.get("LOCAL_SIZE", world))))


# ------------------------------------------------------------------------------------------- metrics


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------- GPU memory

# What the plan predicts per GPU (launcher/plan/memory.py: model states, activations, buffers and the CUDA
# context) is what a process holds on its device: the caching allocator's reservation plus what lies outside
# it (CUDA context, NCCL buffers, cuBLAS handles). Per step, max over ranks: metrics.jsonl and run.json.
GPU_BYTES = "gpu_bytes_per_device"  # peak reserved + outside the allocator: the figure the plan predicts
GPU_RESERVED = "gpu_reserved_bytes_per_device"  # peak the caching allocator reserved (torch max_memory_reserved)
GPU_ALLOCATED = "gpu_allocated_bytes_per_device"  # peak tensors took (torch max_memory_allocated)
GPU_FIGURES = (GPU_BYTES, GPU_RESERVED, GPU_ALLOCATED)
GPU_SOURCE = "gpu_memory_source"  # how the bytes outside the allocator were read (run.json only)
# The ways to read what this process holds on its device, best first; a run reports the worst any rank used.
# "nvml-process": NVML's figure for this process on this device (exact). "device-used": total - free of the
# device (cudaMemGetInfo), which also counts any other process on the same GPU.
GPU_SOURCES = ("nvml-process", "device-used")


def gpu_step_figures(peak_reserved: int, peak_allocated: int, process_used: int, reserved_now: int) -> dict:
    """One rank's GPU memory over one step. `process_used` (what the process holds on the device) and
    `reserved_now` are read together after the step; their difference is what lies outside the caching
    allocator (context, NCCL, cuBLAS), which the peak reservation does not include."""
    outside = max(0, process_used - reserved_now)
    return {GPU_BYTES: peak_reserved + outside, GPU_RESERVED: peak_reserved, GPU_ALLOCATED: peak_allocated}


def gpu_figures_vector(figures: dict, source: str) -> list[float]:
    """A rank's figures as the numbers one all-reduce MAX gathers (the source as its index in GPU_SOURCES)."""
    return [float(figures[key]) for key in GPU_FIGURES] + [float(GPU_SOURCES.index(source))]


def gpu_figures_from_vector(values: list[float]) -> tuple[dict, str]:
    """The inverse of gpu_figures_vector, after the MAX: the largest rank's figures and the worst source."""
    figures = {key: int(value) for key, value in zip(GPU_FIGURES, values, strict=False)}
    return figures, GPU_SOURCES[int(values[len(GPU_FIGURES)])]


class GpuPeaks:
    """The largest per-step figures so far (each one on its own), and the worst source: run.json's GPU part."""

    def __init__(self):
        self.figures: dict[str, int] = {}
        self.source: str | None = None

    def add(self, figures: dict, source: str) -> None:
        for key, value in figures.items():
            self.figures[key] = max(value, self.figures.get(key, value))
        if self.source is None or GPU_SOURCES.index(source) > GPU_SOURCES.index(self.source):
            self.source = source

    def measured(self) -> dict | None:
        """run.json's GPU figures; None before a step on a GPU (and always on the CPU accelerator)."""
        if not self.figures:
            return None
        return {**self.figures, GPU_SOURCE: self.source}


def step_record(
    step: int, loss: float, lr: float, tokens: int, seconds: float, skipped_steps: int, gpu: dict | None
) -> dict:
    """One line of metrics.jsonl; `gpu` (GPU_FIGURES of this step, max over ranks) with a GPU."""
    record = {
        "step": step,
        "loss": loss,
        "lr": lr,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "step_seconds": seconds,
        "cpu_peak_rss_bytes": peak_rss_bytes(),
        "skipped_steps": skipped_steps,  # fp16 overflows (DeepSpeed skips the update)
    }
    if gpu is not None:
        record.update({key: gpu[key] for key in GPU_FIGURES})
    return record


class PhaseClock:
    """Seconds per phase of one optimizer step: `lap(name)` charges the time since the last lap to `name`,
    after `synchronize` (the device's queued work belongs to the phase that queued it). The phases are the
    step-time model's: "passes" (forward and backward with what they overlap) and "update" (the optimizer
    step: CPU-Adam, the weight upload, the NVMe swap)."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        self.synchronize()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now


class Metrics:
    """The steps of this run: OUT/metrics.jsonl (written by rank 0 only, so `enabled` there), the records of
    every step so far (those of an earlier, resumed run included) and this process's step times."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        self.records: list[dict] = read_records(path) if enabled else []
        self.step_seconds: list[float] = []
        self.phase_seconds: dict[str, list[float]] = {}  # phase -> this process's seconds per step

    def add(self, record: dict) -> None:
        self.step_seconds.append(record["step_seconds"])
        for phase in PHASES:
            if phase in record:
                self.phase_seconds.setdefault(phase, []).append(record[phase])
        if self.enabled:
            append_jsonl(self.path, record)
            self.records.append(record)

    @property
    def losses(self) -> list[float]:
        return [record["loss"] for record in self.records]


# ------------------------------------------------------------------------------------------- summary


PHASES = ("passes", "update")  # PhaseClock's phase names, as metrics.jsonl records them


def median_step_seconds(step_seconds: list[float]) -> float | None:
    """The median step time after the warm-up step (all steps when there is no other), None without steps."""
    measured_steps = step_seconds[WARMUP_STEPS_EXCLUDED:] or step_seconds
    return statistics.median(measured_steps) if measured_steps else None


def measured_figures(
    step_seconds: list[float],
    tokens_per_step: int,
    cpu_bytes_per_node: int,
    nvme_bytes_per_node: int,
    gpu: dict | None,
    phase_seconds: dict[str, list[float]] | None = None,
) -> dict:
    """run.json's "measured": the figures the plan predicted, as this run measured them; `gpu`
    (GpuPeaks.measured: the largest step's figures over ranks, and their source) with a GPU; `phase_seconds`
    (Metrics.phase_seconds) the step's phases, each as its median after the warm-up step."""
    median = median_step_seconds(step_seconds)
    measured = {
        "step_seconds": median,  # median after the warm-up step
        "tokens_per_s": tokens_per_step / median if median else None,
        "cpu_bytes_per_node": cpu_bytes_per_node,  # peak RSS of this node's ranks, summed
        "nvme_bytes_per_node": nvme_bytes_per_node,  # swap files at the end of training
    }
    for phase, seconds in (phase_seconds or {}).items():
        measured[f"{phase}_seconds"] = median_step_seconds(seconds)
    if gpu is not None:
        measured.update(gpu)  # GPU_FIGURES (the largest step, max over ranks) and GPU_SOURCE
    return measured


def ratios(measured: dict, predicted: dict) -> dict:
    """measured / predicted for each figure of RATIO_KEYS that both have (and is not zero), and the measured step
    over the calibrated prediction when there was one (plan/calibration.py)."""
    found = {key: measured[key] / predicted[key] for key in RATIO_KEYS if measured.get(key) and predicted.get(key)}
    if measured.get("step_seconds") and predicted.get("calibrated_step_seconds"):
        found["calibrated_step_seconds"] = measured["step_seconds"] / predicted["calibrated_step_seconds"]
    return found


def run_summary(
    spec: RunSpec,
    setup: dict,
    records: list[dict],
    wall: float,
    peak_cpu_rss_bytes: int,
    measured: dict,
    skipped_checkpoints: list[int],
) -> dict:
    """run.json: what ran (`setup`: optimizer, world_size, zero_stage, offload_optimizer, offload_param, ...),
    the losses and tokens of every step (`records`, metrics.jsonl's: a resumed run's earlier steps too), the
    held-out loss, and the plan's predictions next to what was measured, with their ratios."""
    losses = [record["loss"] for record in records]
    evals = [{"step": r["step"], "eval_loss": r["eval_loss"]} for r in records if "eval_loss" in r]
    summary = {
        **setup,
        "steps": spec.steps,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_losses": evals,
        "wall_seconds": wall,
        "tokens_per_s": measured["tokens_per_s"],
        "peak_cpu_rss_bytes": peak_cpu_rss_bytes,
        "predicted": spec.predicted,
        "measured": measured,
        "ratios": ratios(measured, spec.predicted),
        "final_dir": str(spec.out / FINAL_DIR),
        "skipped_checkpoints": list(skipped_checkpoints),
    }
    if any("trained_tokens" in r for r in records):  # what carried loss, and what was read without (prompts)
        summary["tokens"] = {
            "trained": sum(r.get("trained_tokens", 0) for r in records),
            "masked": sum(r.get("masked_tokens", 0) for r in records),
        }
    return summary


# ------------------------------------------------------------------------------------------- bar


class Progress:
    """tqdm bar on a terminal (loss, tokens/s, ETA); a plain line every ~10 % when piped."""

    def __init__(self, enabled: bool, total: int, initial: int):
        self.enabled, self.total, self.step = enabled, total, initial
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        self.step += 1
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
            self.bar.update(1)
        elif self.step == self.total or self.step % max(1, self.total // 10) == 0 or self.step == 1:
            print(
                f"step {self.step}/{self.total} loss {loss:.4f} {tokens_per_s:,.0f} tokens/s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
