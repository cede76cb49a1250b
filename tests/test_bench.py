"""The bench's table renders every row it measured (the bench itself runs with `make bench`, not in tests)."""

from launcher import bench
from launcher.bench import render


def test_render_has_a_row_per_measurement():
    adam = {"seconds": 0.02, "bytes_per_s": 4e10, "fraction_of_memory_bandwidth": 1.2, "speedup_of_cpu_adam": 1.0}
    row = {
        "model": "20M",
        "params": 19_800_000,
        "strategy": "ZeRO-2 opt=cpu param=none",
        "predicted": {"step_seconds": 1.0, "cpu_bytes_per_node": 2**29, "gpu_bytes_per_device": 2**30},
        "measured": {"step_seconds": 0.9, "cpu_bytes_per_node": 2**29, "gpu_bytes_per_device": 2**29},
        "ratios": {"step_seconds": 0.9, "cpu_bytes_per_node": 1.0, "gpu_bytes_per_device": 0.5},
    }
    report = {
        "date": "2026-11-29 12:00 UTC",
        "machine": "test",
        "probe": {"pcie_pinned_h2d_bytes_per_s": 2.5e10},
        "plan_latency": {
            "plan_cold_seconds": 6.0,
            "plan_warm_seconds": 0.4,
            "deepspeed_estimator_seconds": 2.5,
            "cold_over_deepspeed": 2.4,
            "warm_over_deepspeed": 0.16,
        },
        "cpu_adam": {"numel": 32_000_000, "threads": 2, "optimizers": {"DeepSpeedCPUAdam": adam}},
        "predictions": [row],
    }
    table = render(report)
    assert "0.16 x DeepSpeed estimator" in table
    assert "DeepSpeedCPUAdam, 32 M params" in table
    assert "pcie_pinned_h2d_bytes_per_s | 25.0 GB/s" in table
    assert "| 20M (19.8 M) | ZeRO-2 opt=cpu param=none | 0.900 / 1.000 | 0.90 | - | - | 1.00 | 0.50 |" in table
    assert "core binding" not in table  # no pair measured, no table for it


def binding_row(bound: bool, step: float, update: float) -> dict:
    return {
        "model": "20M",
        "params": 19_800_000,
        "strategy": "ZeRO-2 opt=cpu param=none",
        "ranks": 2,
        "bound": bound,
        "predicted": {"step_seconds": 1.0, "cpu_bytes_per_node": 2**29},
        "measured": {"step_seconds": step, "passes_seconds": 0.5, "update_seconds": update},
        "ratios": {"step_seconds": step, "cpu_bytes_per_node": 1.0},
    }


def test_the_core_binding_pair_is_two_rows_and_their_ratio():
    binding = bench.binding_summary([binding_row(False, 1.0, 0.4), binding_row(True, 0.8, 0.2)])
    assert binding["bound_over_unbound"] == {"step_seconds": 0.8, "passes_seconds": 1.0, "update_seconds": 0.5}
    table = bench.render({"date": "2026-11-29 12:00 UTC", "machine": "test", "binding": binding})  # --only binding
    assert table.count("| model | strategy |") == 1 and "core binding, the same run not bound and bound:" in table
    assert "| 20M (19.8 M) | ZeRO-2 opt=cpu param=none, 2 ranks, not bound | 1.000 / 1.000 |" in table
    assert "| 20M (19.8 M) | ZeRO-2 opt=cpu param=none, 2 ranks, bound | 0.800 / 1.000 |" in table
    assert (
        "core binding (20M, ZeRO-2 opt=cpu param=none, 2 ranks), bound / not bound: step 0.80, passes 1.00, " in table
    )
    assert "DeepSpeed estimator" not in table  # only the rows that ran


def test_the_binding_pair_is_skipped_with_its_reason_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    assert bench.binding_skip_reason() == "numactl is not installed"
    assert bench.bench_binding({}, 1, None) == {"skipped": "numactl is not installed", "rows": []}
    table = bench.render({"date": "d", "machine": "m", "binding": {"skipped": "numactl is not installed", "rows": []}})
    assert table.endswith("core binding not measured: numactl is not installed")
    monkeypatch.setattr(bench.shutil, "which", lambda name: "/usr/bin/numactl")
    monkeypatch.setattr("psutil.cpu_count", lambda logical=True: 1)
    assert bench.binding_skip_reason() == "1 core(s) for 2 ranks"


def test_the_bench_runs_the_pair_with_the_flags_and_two_ranks(monkeypatch, tmp_path):
    calls = []

    def train_row(env, model, size, strategy, steps, out, *extra):
        calls.append((size, strategy, steps, extra))
        return binding_row("--bind-cores" in extra, 1.0, 0.4)

    monkeypatch.setattr(bench, "binding_skip_reason", lambda: None)
    monkeypatch.setattr(bench, "train_row", train_row)
    binding = bench.bench_binding({}, 10, tmp_path)
    assert [c[3] for c in calls] == [("--num-gpus", "2", "--no-bind-cores"), ("--num-gpus", "2", "--bind-cores")]
    assert {c[:3] for c in calls} == {("20M", ("2", "cpu", "none"), 10)}
    assert [row["bound"] for row in binding["rows"]] == [False, True]
