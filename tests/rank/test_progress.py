"""metrics.jsonl, the progress lines and run.json's arithmetic: medians, throughput, ratios to the plan."""

from __future__ import annotations

import json

import pytest

from launcher.job.spec import WARMUP_STEPS_EXCLUDED, RunSpec
from launcher.rank.progress import (
    GPU_FIGURES,
    GPU_SOURCES,
    GpuPeaks,
    Metrics,
    Progress,
    gpu_figures_from_vector,
    gpu_figures_vector,
    gpu_step_figures,
    measured_figures,
    median_step_seconds,
    node_count,
    ratios,
    run_summary,
    step_record,
)


def test_the_warm_up_step_is_left_out_of_the_median():
    assert WARMUP_STEPS_EXCLUDED == 1
    assert median_step_seconds([30.0, 1.0, 2.0, 4.0]) == 2.0
    assert median_step_seconds([30.0, 1.0, 2.0]) == 1.5
    assert median_step_seconds([7.0]) == 7.0  # one step: the warm-up is all there is
    assert median_step_seconds([]) is None


def test_measured_figures():
    measured = measured_figures([9.0, 2.0, 2.0], 1024, cpu_bytes_per_node=5, nvme_bytes_per_node=0, gpu=None)
    assert measured == {"step_seconds": 2.0, "tokens_per_s": 512.0, "cpu_bytes_per_node": 5, "nvme_bytes_per_node": 0}
    gpu = {"gpu_bytes_per_device": 7, "gpu_reserved_bytes_per_device": 5, "gpu_allocated_bytes_per_device": 4}
    with_gpu = measured_figures([], 1024, 5, 0, gpu={**gpu, "gpu_memory_source": "nvml-process"})
    assert with_gpu["step_seconds"] is None and with_gpu["tokens_per_s"] is None
    assert with_gpu["gpu_bytes_per_device"] == 7 and with_gpu["gpu_reserved_bytes_per_device"] == 5
    assert with_gpu["gpu_allocated_bytes_per_device"] == 4 and with_gpu["gpu_memory_source"] == "nvml-process"
    assert ratios(with_gpu, {"gpu_bytes_per_device": 14}) == {"gpu_bytes_per_device": 0.5}


def test_ratios_cover_what_both_sides_have():
    measured = {"step_seconds": 3.0, "tokens_per_s": 100.0, "cpu_bytes_per_node": 300, "nvme_bytes_per_node": 0}
    predicted = {"step_seconds": 2.0, "tokens_per_s": 50.0, "cpu_bytes_per_node": 200, "gpu_bytes_per_device": 9}
    assert ratios(measured, predicted) == {"step_seconds": 1.5, "cpu_bytes_per_node": 1.5}
    assert ratios(measured, {}) == {}


def test_run_summary_layout_and_values(tmp_path):
    predicted = {"step_seconds": 1.0, "cpu_bytes_per_node": 100}
    spec = RunSpec(output_dir=str(tmp_path), model="m", data="d", seq_len=8, steps=3, predicted=predicted)
    setup = {
        "optimizer": "DeepSpeedCPUAdam",
        "world_size": 2,
        "zero_stage": 3,
        "offload_optimizer": "cpu",
        "offload_param": "none",
    }
    measured = measured_figures([5.0, 2.0, 2.0], 64, 150, 0, None)
    skipped = [2]
    records = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0, "eval_loss": 3.5}, {"step": 3, "loss": 2.5}]
    summary = run_summary(spec, setup, records, 12.5, 99, measured, skipped)
    assert list(summary) == [
        *setup,
        "steps",
        "first_loss",
        "final_loss",
        "eval_loss",
        "eval_losses",
        "wall_seconds",
        "tokens_per_s",
        "peak_cpu_rss_bytes",
        "predicted",
        "measured",
        "ratios",
        "final_dir",
        "skipped_checkpoints",
    ]
    assert summary["first_loss"] == 4.0 and summary["final_loss"] == 2.5
    assert summary["eval_loss"] == 3.5 and summary["eval_losses"] == [{"step": 2, "eval_loss": 3.5}]
    assert "tokens" not in summary  # steps that did not count their tokens (an earlier version's) say nothing
    assert summary["tokens_per_s"] == 32.0 and summary["steps"] == 3 and summary["wall_seconds"] == 12.5
    assert summary["ratios"] == {"step_seconds": 2.0, "cpu_bytes_per_node": 1.5}
    assert summary["final_dir"] == str(tmp_path / "final")
    skipped.append(4)
    assert summary["skipped_checkpoints"] == [2]  # a copy
    json.dumps(summary)  # run.json is JSON
    empty = run_summary(spec, setup, [], 1.0, 0, measured, [])
    assert empty["first_loss"] is None and empty["final_loss"] is None and empty["eval_loss"] is None
    counted = [{"step": s, "loss": 1.0, "trained_tokens": 10 * s, "masked_tokens": s} for s in (1, 2)]
    assert run_summary(spec, setup, counted, 1.0, 0, measured, [])["tokens"] == {"trained": 30, "masked": 3}


def test_step_record():
    record = step_record(3, 2.5, 1e-3, tokens=512, seconds=2.0, skipped_steps=1, gpu=None)
    assert record["tokens_per_s"] == 256.0 and record["step_seconds"] == 2.0 and record["skipped_steps"] == 1
    assert record["cpu_peak_rss_bytes"] > 0 and not set(GPU_FIGURES) & set(record)
    gpu = gpu_step_figures(peak_reserved=10, peak_allocated=8, process_used=15, reserved_now=9)
    with_gpu = step_record(3, 2.5, 1e-3, 512, 2.0, 0, gpu=gpu)
    assert {k: with_gpu[k] for k in GPU_FIGURES} == {
        "gpu_bytes_per_device": 16,
        "gpu_reserved_bytes_per_device": 10,
        "gpu_allocated_bytes_per_device": 8,
    }


GIB = 2**30


def test_gpu_bytes_are_the_peak_reservation_plus_what_lies_outside_the_allocator():
    # the step peaked at 20 GiB reserved; now the process holds 11.5 GiB of which the allocator has 10.5:
    # 1 GiB of context, NCCL and cuBLAS lies outside it, at every moment of the step
    figures = gpu_step_figures(20 * GIB, 18 * GIB, process_used=23 * GIB // 2, reserved_now=21 * GIB // 2)
    assert figures == {
        "gpu_bytes_per_device": 21 * GIB,
        "gpu_reserved_bytes_per_device": 20 * GIB,
        "gpu_allocated_bytes_per_device": 18 * GIB,
    }
    # a process figure below the reservation (read a moment apart) adds nothing rather than subtracting
    assert gpu_step_figures(5, 4, process_used=3, reserved_now=5)["gpu_bytes_per_device"] == 5


def test_gpu_figures_travel_as_one_vector_and_the_worst_source_wins():
    figures = gpu_step_figures(20 * GIB, 18 * GIB, 23 * GIB, 20 * GIB)
    for source in GPU_SOURCES:
        vector = gpu_figures_vector(figures, source)
        assert all(isinstance(v, float) for v in vector)
        assert gpu_figures_from_vector(vector) == (figures, source)
    # byte counts survive float64 exactly (the all-reduce runs in float64)
    big = gpu_step_figures(2**50 + 1, 2**50 - 1, 2**50 + 1, 2**50 + 1)
    assert gpu_figures_from_vector(gpu_figures_vector(big, GPU_SOURCES[0]))[0] == big


def test_gpu_peaks_keep_each_figures_largest_step():
    peaks = GpuPeaks()
    assert peaks.measured() is None  # the CPU accelerator, or no step yet: run.json has no GPU figures
    peaks.add(gpu_step_figures(10, 9, 12, 10), "nvml-process")
    peaks.add(gpu_step_figures(8, 8, 14, 8), "device-used")  # less reserved, more outside the allocator
    peaks.add(gpu_step_figures(9, 9, 9, 9), "nvml-process")
    assert peaks.measured() == {
        "gpu_bytes_per_device": 14,
        "gpu_reserved_bytes_per_device": 10,
        "gpu_allocated_bytes_per_device": 9,
        "gpu_memory_source": "device-used",
    }


def test_metrics_continue_a_resumed_file_on_rank_0_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 4.0}) + "\n\n")
    metrics = Metrics(path, enabled=True)
    assert metrics.losses == [4.0]
    metrics.add(step_record(2, 3.0, 1e-3, 64, 0.5, 0, None))
    assert metrics.losses == [4.0, 3.0] and metrics.step_seconds == [0.5]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines() if line] == [1, 2]

    other = Metrics(tmp_path / "rank1.jsonl", enabled=False)
    other.add(step_record(2, 3.0, 1e-3, 64, 0.25, 0, None))
    assert other.losses == [] and other.step_seconds == [0.25]
    assert not (tmp_path / "rank1.jsonl").exists()


@pytest.mark.parametrize(
    "world, env, nodes",
    [
        (8, {}, 1),
        (16, {"LOCAL_SIZE": "8"}, 2),
        (16, {"CROSS_SIZE": "4", "LOCAL_SIZE": "8"}, 4),
        (2, {"LOCAL_SIZE": "4"}, 1),
    ],
)
def test_node_count(world, env, nodes):
    assert node_count(world, env) == nodes


def test_piped_progress_prints_the_first_last_and_every_tenth_step(capsys):
    progress = Progress(enabled=True, total=30, initial=0)
    for _ in range(30):
        progress.update(1.5, 1234.0)
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [1, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert lines[0] == "step 1/30 loss 1.5000 1,234 tokens/s"


def test_progress_resumes_its_count_and_is_silent_off_rank_0(capsys):
    progress = Progress(enabled=True, total=10, initial=8)
    progress.update(1.0, 10.0)
    Progress(enabled=False, total=10, initial=0).update(1.0, 10.0)
    assert capsys.readouterr().err.splitlines() == ["step 9/10 loss 1.0000 10 tokens/s"]
