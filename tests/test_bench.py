"""The bench's table renders every row it measured (the bench itself runs with `make bench`, not in tests)."""

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
