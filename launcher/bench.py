"""`make bench`: measured side by side in one run, printed as a table and written to bench.json.

1. Plan latency: a Llama-2-7B dry run (cold cache and warm) against DeepSpeed's own estimator one-liner
   (`estimate_zero3_model_states_mem_needs_all_cold`), each in a fresh Python process.
2. DeepSpeedCPUAdam against torch.optim.AdamW (foreach and fused) on the same parameters, and the bytes/s
   each achieves as a fraction of the measured memory bandwidth.
3. Predicted against measured step seconds (and its two phases, passes and update) and CPU memory for three
   model sizes (~1 M, 20 M, 100 M parameters) trained on this machine under no offload, ZeRO-2 + optimizer on
   CPU, ZeRO-3 + optimizer and parameters on CPU, and ZeRO-3 with both on NVMe (after `offload-launch probe`,
   so the plan uses this host's figures; each run measures its passes at its model's shapes first).
4. Core binding: the 20 M model under ZeRO-2 + optimizer on CPU with 2 ranks, once with DeepSpeed's
   --bind_cores_to_rank (each rank under numactl on its half of the cores) and once without.

Run: python -m launcher.bench [--out bench.json] [--quick] [--only binding]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.plan.rates import ADAM_BYTES_PER_PARAM
from launcher.resources import resource_path

DEMO = resource_path("demo")
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
    from launcher.measure.probe import best_seconds

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
        seconds = best_seconds(optimizer.step, 5)
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


STRATEGIES = (("2", "none", "none"), ("2", "cpu", "none"), ("3", "cpu", "cpu"), ("3", "nvme", "nvme"))
# Llama shapes of about 1 M, 20 M and 100 M parameters (the demo's vocabulary and tokenizer): name ->
# (hidden, intermediate, layers, heads). The first is the bundled demo model itself.
SIZES = {"1M": (128, 352, 4, 4), "20M": (512, 1376, 6, 8), "100M": (768, 2048, 14, 12)}
# Steps per run, by size: each row trains for 10-60 s on two cores, so that its median step spans more than one of the
# host's speed swings (the development machine, idle: a tiny model's pass 14-27 ms within a minute); quick: 4.
BENCH_STEPS = {"1M": 60, "20M": 20, "100M": 10}
QUICK_STEPS = 4


def bench_model(name: str, workdir: Path) -> Path:
    """A config-only Llama of SIZES[name] with the demo's tokenizer (the trainer initialises it at random)."""
    hidden, intermediate, layers, heads = SIZES[name]
    config = json.loads((DEMO / "tiny-llama" / "config.json").read_text())
    config.update(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
    )
    folder = workdir / f"llama-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for tokenizer_file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / "tiny-llama" / tokenizer_file, folder / tokenizer_file)
    return folder


def train_row(env: dict, model: Path, size: str, strategy: tuple[str, str, str], steps: int, out: Path, *extra):
    """One training run of `model` on this host under `strategy` (stage, optimizer, param): its predicted and
    measured figures, and whether DeepSpeed bound its ranks to cores (the launch line it printed says)."""
    stage, optimizer, param = strategy
    argv = [
        *(sys.executable, "-m", "launcher", "--model", str(model)),
        *("--data", str(DEMO / "data" / "train.jsonl"), "--output-dir", str(out), "--no-resume"),
        *("--zero-stage", stage, "--offload-optimizer", optimizer, "--offload-param", param),
        *("--seq-len", "128", "--micro-batch", "4", "--steps", str(steps), "--save-every", "0"),
        *("--lr", "1e-3", "--warmup-steps", "2", *extra),
    ]
    seconds, proc = _timed(argv, env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    run = json.loads((out / "run.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    return {
        "model": size,
        "params": plan["model"]["params"],
        "strategy": f"ZeRO-{stage} opt={optimizer} param={param}",
        "ranks": plan["workload"]["world_size"],
        "bound": "--bind_cores_to_rank" in proc.stdout,
        "wall_seconds": seconds,
        "predicted": run["predicted"],
        "measured": run["measured"],
        "ratios": run["ratios"],
    }


def bench_predictions(env: dict, steps: dict, workdir: Path, sizes: tuple[str, ...], nvme_dir: Path) -> list[dict]:
    """Each size under each strategy, trained for real on this host: predicted next to measured (the NVMe rows
    swap to `nvme_dir`, the folder the probe measured)."""
    from launcher.inspection.host import aio_usable

    rows = []
    for size in sizes:
        model = bench_model(size, workdir)
        for stage, optimizer, param in STRATEGIES:
            extra = []
            if "nvme" in (optimizer, param):
                if not aio_usable():
                    continue
                extra = ["--nvme-path", str(nvme_dir)]
            out = workdir / f"{size}-z{stage}-{optimizer}-{param}"
            print(f"  {size} ZeRO-{stage} opt={optimizer} param={param} ...", file=sys.stderr)
            rows.append(train_row(env, model, size, (stage, optimizer, param), steps[size], out, *extra))
    return rows


# Core binding, measured once: this model and strategy with this many ranks, bound and not bound.
BINDING_SIZE, BINDING_STRATEGY, BINDING_RANKS = "20M", ("2", "cpu", "none"), 2


def binding_skip_reason() -> str | None:
    """Why this host cannot run the core-binding pair (None: it can)."""
    import psutil

    if shutil.which("numactl") is None:
        return "numactl is not installed"
    cores = psutil.cpu_count(logical=False) or 0
    if cores < BINDING_RANKS:
        return f"{cores} core(s) for {BINDING_RANKS} ranks"
    return None


def bench_binding(env: dict, steps: int, workdir: Path, size: str = BINDING_SIZE) -> dict:
    """The same run not bound, then bound (--no-bind-cores, --bind-cores): both rows and bound / not bound."""
    skipped = binding_skip_reason()
    if skipped:
        print(f"  core binding skipped: {skipped}", file=sys.stderr)
        return {"skipped": skipped, "rows": []}
    model = bench_model(size, workdir)
    rows = []
    for flag in ("--no-bind-cores", "--bind-cores"):
        print(f"  {size} ZeRO-2 opt=cpu, {BINDING_RANKS} ranks, {flag} ...", file=sys.stderr)
        out = workdir / f"{size}-binding{flag}"
        rows.append(train_row(env, model, size, BINDING_STRATEGY, steps, out, "--num-gpus", str(BINDING_RANKS), flag))
    return binding_summary(rows)


def binding_summary(rows: list[dict]) -> dict:
    """The pair's rows and bound / not bound for the step and each phase the runs measured."""
    by = {row["bound"]: row["measured"] for row in rows}
    ratios = {}
    if True in by and False in by:
        for key in ("step_seconds", "passes_seconds", "update_seconds"):
            if by[True].get(key) and by[False].get(key):
                ratios[key] = by[True][key] / by[False][key]
    return {"rows": rows, "bound_over_unbound": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="offload-launch benchmark")
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (for a smoke test of the bench)")
    parser.add_argument("--only", choices=("binding",), help="only these rows: binding, the core-binding pair")
    args = parser.parse_args(argv)
    # Everything measured in this run, side by side: a cache of its own (probe figures, passes at each model's
    # shapes, finished runs' calibration), since this machine's speed drifts by up to 2x between days and a
    # figure cached on another day would be compared with today's steps. DeepSpeed's compiled ops stay where
    # TORCH_EXTENSIONS_DIR (or the default cache) keeps them.
    bench_cache = tempfile.mkdtemp(prefix="offload-launch-bench-cache-")
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CACHE_HOME=bench_cache, TORCH_EXTENSIONS_DIR=extensions)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_line()}
    steps = dict.fromkeys(SIZES, QUICK_STEPS) if args.quick else BENCH_STEPS
    if args.only == "binding":  # the runs measure what this host's cache lacks themselves
        print("core binding: bound and not bound ...", file=sys.stderr)
        with tempfile.TemporaryDirectory() as workdir:
            report["binding"] = bench_binding(env, steps[BINDING_SIZE], Path(workdir))
    else:
        report |= bench_everything(env, steps, args.quick)
    shutil.rmtree(bench_cache, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0


def bench_everything(env: dict, steps: dict, quick: bool) -> dict:
    """The whole bench in one run: the probe, the plan's latency, CPU-Adam, the predicted-vs-measured training rows
    and the core-binding pair."""
    from launcher.inspection.host import aio_usable

    print("probing this host (offload-launch probe) ...", file=sys.stderr)
    nvme_dir = Path(tempfile.mkdtemp(prefix="offload-launch-bench-nvme-"))  # the NVMe rows swap here too
    probe_argv = [sys.executable, "-m", "launcher", "probe", "--json", *(["--quick"] if quick else [])]
    if aio_usable():
        probe_argv += ["--nvme-path", str(nvme_dir)]
    probe = subprocess.run(probe_argv, capture_output=True, text=True, env=env, timeout=900)
    if probe.returncode != 0:
        raise SystemExit(probe.stderr[-2000:])
    figures = json.loads(probe.stdout)["figures"]
    print("plan latency ...", file=sys.stderr)
    latency = bench_plan_latency(env)
    print("CPU-Adam vs torch AdamW ...", file=sys.stderr)
    adam = bench_cpu_adam(2_000_000 if quick else 32_000_000, figures["cpu_memory_bandwidth_bytes_per_s"])
    print("predicted vs measured training steps ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as workdir:
        sizes = ("1M",) if quick else tuple(SIZES)
        predictions = bench_predictions(env, steps, Path(workdir), sizes, nvme_dir)
        print("core binding: bound and not bound ...", file=sys.stderr)
        size = "1M" if quick else BINDING_SIZE
        binding = bench_binding(env, steps[size], Path(workdir), size)
    shutil.rmtree(nvme_dir, ignore_errors=True)
    return {"probe": figures, "plan_latency": latency, "cpu_adam": adam, "predictions": predictions, "binding": binding}


def machine_line() -> str:
    import psutil

    return (
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count(logical=False)} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, python {platform.python_version()}"
    )


def render(report: dict) -> str:
    """The bench's tables; a report of some rows only (--only) renders those."""
    lines = [f"offload-launch bench, {report['date']}, {report['machine']}"]
    if "plan_latency" in report:
        lines += render_measurements(report)
    if report.get("predictions"):
        lines += render_predictions(report["predictions"])
    binding = report.get("binding", {"rows": []})
    if binding["rows"]:  # another measurement (several ranks, bound and not): a table of its own
        lines += ["", "core binding, the same run not bound and bound:"]
        lines += render_predictions(binding["rows"])
    if binding.get("skipped"):
        lines += ["", f"core binding not measured: {binding['skipped']}"]
    elif binding.get("bound_over_unbound"):
        ratios = binding["bound_over_unbound"]
        first = binding["rows"][0]
        phases = ", ".join(f"{key.removesuffix('_seconds')} {value:.2f}" for key, value in ratios.items())
        lines += [
            "",
            f"core binding ({first['model']}, {first['strategy']}, {first['ranks']} ranks), bound / not bound: "
            f"{phases}",
        ]
    return "\n".join(lines)


def render_measurements(report: dict) -> list[str]:
    lat, adam = report["plan_latency"], report["cpu_adam"]
    lines = [
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
    return lines


def strategy_cell(row: dict) -> str:
    """The strategy, with the ranks when more than one and whether they were bound to cores (rows from before
    the bench recorded it say nothing)."""
    cell = row["strategy"]
    if row.get("ranks", 1) > 1:
        cell += f", {row['ranks']} ranks"
    if "bound" in row:
        cell += ", bound" if row["bound"] else ", not bound"
    return cell


def render_predictions(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "| model | strategy | step s measured / predicted | step | passes | update | CPU memory | GPU memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratios, measured, predicted = row["ratios"], row["measured"], row["predicted"]
        cells = [
            f"{ratios[key]:.2f}" if key in ratios else "-"
            for key in (
                "step_seconds",
                "passes_seconds",
                "update_seconds",
                "cpu_bytes_per_node",
                "gpu_bytes_per_device",
            )
        ]
        lines.append(
            f"| {row['model']} ({row['params'] / 1e6:.1f} M) | {strategy_cell(row)} | "
            f"{measured['step_seconds']:.3f} / {predicted['step_seconds']:.3f} | {' | '.join(cells)} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
