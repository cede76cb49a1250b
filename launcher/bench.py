"""`make bench`: measured side by side in one run, printed as a table and written to bench.json.

1. Plan latency: a Llama-2-7B dry run (cold cache and warm) against DeepSpeed's own estimator one-liner
   (`estimate_zero3_model_states_mem_needs_all_cold`), each in a fresh Python process.
2. DeepSpeedCPUAdam against torch.optim.AdamW (foreach and fused) on the same parameters, and the bytes/s
   each achieves as a fraction of the measured memory bandwidth.
3. Predicted against measured step seconds and CPU memory for a small model trained on this machine
   under each offload strategy (after `offload-launch probe`, so the plan uses this host's figures).

Run: python -m launcher.bench [--out bench.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.resources import resource_path

DEMO = resource_path("demo")
ADAM_BYTES_PER_PARAM = 28  # Adam reads param, grad, m, v (4 x 4 B) and writes param, m, v (3 x 4 B)
LLAMA2_7B = {"total_params": 6_738_415_616, "largest_layer_params": 202_383_360}


def _timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    return time.perf_counter() - start, proc


def bench_plan_latency(env: dict) -> dict:
    host = str(resource_path("recipes/hosts/1x-a100-80g.yaml"))
    plan = [
        sys.executable,
        "-m",
        "launcher",
        "--model",
        "meta-llama/Llama-2-7b",
        "--dry-run",
        "--json",
        "--host-spec",
        host,
    ]
    with tempfile.TemporaryDirectory() as cache:
        fresh = dict(env, XDG_CACHE_HOME=cache)
        cold, proc = _timed(plan, fresh)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        warm = min(_timed(plan, fresh)[0] for _ in range(3))
    estimator = (
        "from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as e; "
        f"e(total_params={LLAMA2_7B['total_params']}, largest_layer_params={LLAMA2_7B['largest_layer_params']}, "
        "num_gpus_per_node=1, num_nodes=1)"
    )
    deepspeed = min(_timed([sys.executable, "-c", estimator], env)[0] for _ in range(3))
    return {
        "plan_cold_seconds": cold,
        "plan_warm_seconds": warm,
        "deepspeed_estimator_seconds": deepspeed,
        "warm_over_deepspeed": warm / deepspeed,
        "cold_over_deepspeed": cold / deepspeed,
    }


def bench_cpu_adam(numel: int, bandwidth: float) -> dict:
    import torch

    from launcher.deepspeed_logging import import_deepspeed
    from launcher.inspection.rates import _best_seconds

    import_deepspeed()
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    def make():
        param = torch.nn.Parameter(torch.zeros(numel, dtype=torch.float32))
        param.grad = torch.randn(numel) * 1e-3
        return param

    results = {}
    optimizers = {
        "DeepSpeedCPUAdam": lambda p: DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True),
        "torch AdamW foreach": lambda p: torch.optim.AdamW([p], lr=1e-4, foreach=True),
        "torch AdamW fused": lambda p: torch.optim.AdamW([p], lr=1e-4, fused=True),
    }
    for name, build in optimizers.items():
        optimizer = build(make())
        optimizer.step()
        seconds = _best_seconds(optimizer.step, 5)
        results[name] = {
            "seconds": seconds,
            "params_per_s": numel / seconds,
            "bytes_per_s": ADAM_BYTES_PER_PARAM * numel / seconds,
            "fraction_of_memory_bandwidth": ADAM_BYTES_PER_PARAM * numel / seconds / bandwidth,
        }
    reference = results["DeepSpeedCPUAdam"]["seconds"]
    for entry in results.values():
        entry["speedup_of_cpu_adam"] = entry["seconds"] / reference
    return {"numel": numel, "threads": torch.get_num_threads(), "optimizers": results}


STRATEGIES = (("2", "cpu", "none"), ("3", "cpu", "cpu"), ("3", "nvme", "nvme"))


def bench_predictions(env: dict, steps: int, workdir: Path) -> list[dict]:
    from launcher.inspection.host import aio_usable

    rows = []
    for stage, optimizer, param in STRATEGIES:
        extra = []
        if "nvme" in (optimizer, param):
            if not aio_usable():
                continue
            (workdir / "nvme").mkdir(exist_ok=True)
            extra = ["--nvme-path", str(workdir / "nvme")]
        out = workdir / f"z{stage}-{optimizer}-{param}"
        argv = [
            sys.executable,
            "-m",
            "launcher",
            "--model",
            str(DEMO / "tiny-llama"),
            "--data",
            str(DEMO / "data" / "train.jsonl"),
            "--output-dir",
            str(out),
            "--no-resume",
            "--zero-stage",
            stage,
            "--offload-optimizer",
            optimizer,
            "--offload-param",
            param,
            "--seq-len",
            "128",
            "--micro-batch",
            "4",
            "--steps",
            str(steps),
            "--lr",
            "3e-3",
            "--warmup-steps",
            "2",
            *extra,
        ]
        seconds, proc = _timed(argv, env)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        run = json.loads((out / "run.json").read_text())
        rows.append(
            {
                "strategy": f"ZeRO-{stage} opt={optimizer} param={param}",
                "wall_seconds": seconds,
                "predicted": run["predicted"],
                "measured": run["measured"],
                "ratios": run["ratios"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="offload-launch benchmark")
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (for a smoke test of the bench)")
    args = parser.parse_args(argv)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    print("probing this host (offload-launch probe) ...", file=sys.stderr)
    probe_argv = [sys.executable, "-m", "launcher", "probe", "--json", *(["--quick"] if args.quick else [])]
    probe = subprocess.run(probe_argv, capture_output=True, text=True, env=env, timeout=900)
    if probe.returncode != 0:
        raise SystemExit(probe.stderr[-2000:])
    figures = json.loads(probe.stdout)["figures"]

    print("plan latency ...", file=sys.stderr)
    latency = bench_plan_latency(env)
    print("CPU-Adam vs torch AdamW ...", file=sys.stderr)
    adam = bench_cpu_adam(2_000_000 if args.quick else 32_000_000, figures["cpu_memory_bandwidth_bytes_per_s"])
    print("predicted vs measured training steps ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as workdir:
        predictions = bench_predictions(env, 4 if args.quick else 12, Path(workdir))

    import psutil

    machine = (
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count(logical=False)} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, python {platform.python_version()}"
    )
    report = {
        "date": started,
        "machine": machine,
        "probe": figures,
        "plan_latency": latency,
        "cpu_adam": adam,
        "predictions": predictions,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0


def render(report: dict) -> str:
    lat, adam = report["plan_latency"], report["cpu_adam"]
    lines = [
        f"offload-launch bench, {report['date']}, {report['machine']}",
        "",
        "| measurement | value | ratio |",
        "|---|---|---|",
        f"| 7B dry run, cold cache (fresh process) | {lat['plan_cold_seconds']:.2f} s | "
        f"{lat['cold_over_deepspeed']:.2f} x DeepSpeed estimator |",
        f"| 7B dry run, warm cache (fresh process) | {lat['plan_warm_seconds']:.2f} s | "
        f"{lat['warm_over_deepspeed']:.2f} x DeepSpeed estimator |",
        f"| DeepSpeed `estimate_zero3_model_states_mem_needs_all_cold` (fresh process) | "
        f"{lat['deepspeed_estimator_seconds']:.2f} s | 1 |",
    ]
    for name, row in adam["optimizers"].items():
        lines.append(
            f"| {name}, {adam['numel'] / 1e6:.0f} M params, {adam['threads']} threads | "
            f"{row['seconds'] * 1e3:.1f} ms/step, {row['bytes_per_s'] / 1e9:.1f} GB/s "
            f"({row['fraction_of_memory_bandwidth']:.0%} of memory bandwidth) | "
            f"{row['speedup_of_cpu_adam']:.2f} x CPU-Adam's time |"
        )
    for name, value in report["probe"].items():
        if name.startswith("pcie_"):  # with a GPU: host<->device copies, pinned and pageable
            lines.append(f"| {name} | {value / 1e9:.1f} GB/s | |")
    for row in report["predictions"]:
        ratios = row["ratios"]
        if "gpu_bytes_per_device" in ratios:
            lines.append(
                f"| {row['strategy']}: GPU memory measured / predicted | "
                f"{row['measured']['gpu_bytes_per_device'] / 2**20:.0f} MiB vs "
                f"{row['predicted']['gpu_bytes_per_device'] / 2**20:.0f} MiB | "
                f"{ratios['gpu_bytes_per_device']:.2f} |"
            )
        lines.append(
            f"| {row['strategy']}: step time measured / predicted | "
            f"{row['measured']['step_seconds']:.3f} s vs {row['predicted']['step_seconds']:.3f} s | "
            f"{ratios.get('step_seconds', float('nan')):.2f} |"
        )
        lines.append(
            f"| {row['strategy']}: CPU memory measured / predicted | "
            f"{row['measured']['cpu_bytes_per_node'] / 2**20:.0f} MiB vs "
            f"{row['predicted']['cpu_bytes_per_node'] / 2**20:.0f} MiB | "
            f"{ratios.get('cpu_bytes_per_node', float('nan')):.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
