"""`make gpu-check`: on a host with one CUDA GPU, in a few minutes, measure what the planner predicts.

1. `offload-launch probe` at the check model's shapes: host<->device copies pinned and pageable both ways,
   the GPU's bf16 matmul rate (hidden x hidden, hidden x intermediate at tokens-per-micro-batch rows),
   DeepSpeedCPUAdam (one rank: all the cores), NVMe through async_io when libaio is there.
2. A smoke run (`offload-launch --smoke --smoke-layers 1`) of a Llama-shaped model cut to one layer under
   each strategy family: ZeRO-2 without offload and with the optimizer on the CPU, ZeRO-3 without offload
   and with optimizer and parameters on the CPU, ZeRO-3 on NVMe when libaio is there. The plans use the
   probe just cached, so the predicted step time runs on measured rates.
3. One JSON (--out): per strategy, predicted vs measured peak GPU memory per device (the caching
   allocator's reserved peak), CPU memory per node (peak RSS) and step time, with the ratios.

Everything is made here, offline: the model is a LlamaConfig (random weights; Llama-2-7B's shapes on a GPU,
a tiny one on the CPU), the tokenizer is trained on the bundled demo text, the data is that text.

Without a GPU (or with --cpu) the same runs use DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) on a tiny
model with 2 steps and one strategy unless --strategies says otherwise: the JSON has the same shape, and
tests/test_gpu_check.py checks it.

    python scripts/gpu_check.py --out gpu-check.json [--work DIR] [--cpu] [--strategies 2:cpu:none,3:cpu:cpu]

Exit status 0 when every strategy's smoke run passed, 1 otherwise (the JSON is written either way).
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

REPO = Path(__file__).resolve().parents[1]
DEMO_TEXT = REPO / "launcher" / "demo" / "data" / "train.jsonl"

# (zero stage, optimizer offload, parameter offload): one per strategy family
GPU_STRATEGIES = ("2:none:none", "2:cpu:none", "3:none:none", "3:cpu:cpu", "3:nvme:nvme")
CPU_STRATEGIES = ("2:cpu:none",)
# Llama-2-7B's layer shapes (meta-llama/Llama-2-7b-hf config.json), cut to one layer by --smoke-layers 1
GPU_MODEL = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
CPU_MODEL = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": None,  # the tokenizer's
    "max_position_embeddings": 256,
}
GPU_WORKLOAD = {"seq_len": 1024, "micro_batch": 2, "steps": 5}
CPU_WORKLOAD = {"seq_len": 64, "micro_batch": 2, "steps": 2}
RUN_TIMEOUT_MINUTES = 6


def log(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_model(directory: Path, shape: dict) -> Path:
    """A LlamaForCausalLM config (no weights) and a byte-level BPE tokenizer trained on the demo text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    texts = [json.loads(line)["text"] for line in DEMO_TEXT.read_text().splitlines()]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)
    config = dict(shape, vocab_size=shape["vocab_size"] or len(fast))
    LlamaConfig(
        **config,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    ).save_pretrained(directory)
    return directory


def parse_strategies(text: str) -> list[tuple[str, str, str]]:
    out = []
    for item in text.split(","):
        stage, optimizer, param = item.strip().split(":")
        if stage not in ("0", "1", "2", "3") or not {optimizer, param} <= {"none", "cpu", "nvme"}:
            raise SystemExit(f"--strategies: bad item {item!r} (STAGE:OPTIMIZER:PARAM, e.g. 3:cpu:cpu)")
        out.append((stage, optimizer, param))
    return out


def aio_usable() -> bool:
    try:
        from launcher.inspection.host import aio_usable as usable

        return bool(usable())
    except Exception:  # noqa: BLE001 - a broken op loader means: no NVMe here
        return False


def run_cli(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
    )


# measured / predicted within which a prediction holds: peak memory (GPU and host RAM) and the warm step time
MEMORY_BAND = (0.9, 1.1)
STEP_BAND = (0.8, 1.25)


def band(predicted: float | None, measured: float | None, limits: tuple[float, float]) -> dict:
    """The figure predicted and measured, their ratio and whether it lies in `limits` (None: not measured)."""
    ratio = measured / predicted if predicted and measured else None
    within = None if ratio is None else limits[0] <= ratio <= limits[1]
    return {
        "predicted": predicted,
        "measured": measured,
        "measured_over_predicted": ratio,
        "band": list(limits),
        "within": within,
    }


BANDED = ("gpu_bytes_per_device", "cpu_bytes_per_node", "step_seconds")


def bands_hold(record: dict) -> bool:
    """Every banded figure of a smoke run that was measured lies in its band."""
    return all(record.get(name, {}).get("within") is not False for name in BANDED)


def table(runs: list[dict]) -> str:
    """The measured/predicted ratios per strategy, one line each (what the docs quote)."""

    def ratio(record: dict, name: str) -> str:
        value = record.get(name, {}).get("measured_over_predicted")
        return "-" if value is None else f"{value:.2f}" + ("" if record[name]["within"] else " !")

    lines = [f"{'strategy':<20} {'GPU mem':>9} {'host RAM':>9} {'step':>9}  result"]
    for record in runs:
        name = record.get("strategy", "?")
        if "skipped" in record:
            lines.append(f"{name:<20} skipped: {record['skipped']}")
            continue
        cells = [ratio(record, key) for key in BANDED]
        lines.append(
            f"{name:<20} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9}  {'pass' if record.get('passed') else 'FAIL'}"
        )
    return "\n".join(lines)


def probe(model: Path, tokens: int, env: dict, *, quick: bool, nvme: Path | None) -> dict:
    argv = ["probe", "--json", "--model", str(model), "--tokens", str(tokens)] + (["--quick"] if quick else [])
    if nvme is not None:
        argv += ["--nvme-path", str(nvme)]
    t0 = time.monotonic()
    proc = run_cli(argv, env, timeout=900)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        return {"ok": False, "seconds": seconds, "error": proc.stderr[-3000:]}
    data = json.loads(proc.stdout)
    return {
        "ok": True,
        "seconds": seconds,
        "figures": data["figures"],
        "gpu_matmul": data["details"].get("gpu_matmul"),
        "gpu_matmul_flops_per_s_by_width": data["details"].get("gpu_matmul_flops_per_s_by_width"),
        "cpu_adam_threads": data["details"].get("cpu_adam_threads"),
        "quick": quick,
    }


def smoke_run(
    model: Path, data: Path, out: Path, strategy: tuple[str, str, str], workload: dict, env: dict, *, gpu: bool
) -> dict:
    stage, optimizer, param = strategy
    record: dict = {
        "strategy": f"ZeRO-{stage} optimizer={optimizer} param={param}",
        "zero_stage": int(stage),
        "offload_optimizer": optimizer,
        "offload_param": param,
    }
    argv = ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--smoke", "--smoke-layers", "1"]
    argv += ["--zero-stage", stage, "--offload-optimizer", optimizer, "--offload-param", param]
    argv += ["--steps", str(workload["steps"]), "--seq-len", str(workload["seq_len"])]
    argv += ["--micro-batch", str(workload["micro_batch"]), "--smoke-timeout", str(RUN_TIMEOUT_MINUTES), "--json"]
    if gpu:
        argv += ["--num-gpus", "1"]
    if "nvme" in (optimizer, param):
        nvme = out.parent / f"nvme-{out.name}"
        nvme.mkdir(parents=True, exist_ok=True)
        argv += ["--nvme-path", str(nvme)]
    t0 = time.monotonic()
    try:
        proc = run_cli(argv, env, timeout=RUN_TIMEOUT_MINUTES * 60 + 120)
    except subprocess.TimeoutExpired:
        return record | {"passed": False, "error": "timed out", "seconds": time.monotonic() - t0}
    record["seconds"] = time.monotonic() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return record | {"passed": False, "exit_code": proc.returncode, "error": proc.stderr[-3000:]}
    record |= {
        "passed": report["passed"],
        "exit_code": report["exit_code"],
        "failed_check": report["failed_check"],
        "planned_strategy": report["strategy"],
    }
    if not report["passed"]:
        record["error"] = proc.stderr[-3000:]
    checks = {c["name"]: c for c in report["checks"]}
    memory = checks.get("memory", {}).get("details") or {}
    loss = checks.get("loss", {})
    predicted_memory, measured_memory = memory.get("predicted", {}), memory.get("measured", {})
    spec = _read_json(out / "run_spec.json") or {}
    predicted_step = (spec.get("predicted") or {}).get("step_seconds")
    losses = (loss.get("details") or {}).get("losses") or []
    measured_step, how = warm_step_seconds((loss.get("details") or {}).get("step_seconds") or [])
    record["gpu_bytes_per_device"] = band(
        predicted_memory.get("gpu_bytes_per_device"), measured_memory.get("gpu_bytes_per_device"), MEMORY_BAND
    )
    record["cpu_bytes_per_node"] = band(
        predicted_memory.get("cpu_bytes_per_node"), measured_memory.get("cpu_bytes_per_node"), MEMORY_BAND
    )
    record["step_seconds"] = band(predicted_step, measured_step, STEP_BAND) | {"measured_how": how}
    if gpu and not bands_hold(record):  # on the GPU the predictions are what is checked; on the CPU only the path
        record["passed"] = False
        record["failed_check"] = record.get("failed_check") or "bands"
    record["losses"] = losses
    return record


def warm_step_seconds(steps: list[float]) -> tuple[float | None, str]:
    """(seconds, how): the median of a smoke run's steps after the first, which compiles kernels and warms the
    allocator up (the plan predicts a step of the run, not its first); with one step, that one."""
    import statistics

    if len(steps) >= 2:
        return statistics.median(steps[1:]), f"median of the smoke run's {len(steps) - 1} steps after the first"
    if steps:
        return steps[0], "the smoke run's only step (warm-up included)"
    return None, "no step timed"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def default_extensions_dir() -> str:
    """Where torch builds JIT ops when TORCH_EXTENSIONS_DIR is unset (cpp_extension._get_build_directory):
    the folder under XDG_CACHE_HOME that changing XDG_CACHE_HOME would otherwise move."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    cuda = "cpu" if torch.version.cuda is None else f"cu{torch.version.cuda.replace('.', '')}"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
    return os.path.join(get_default_build_root(), f"{python}_{cuda}")


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "deepspeed", "transformers", "offload-launch"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def device_info(gpu: bool) -> dict:
    import torch

    info = {"accelerator": "cuda" if gpu else "cpu", "cpu_cores": os.cpu_count(), "host": platform.node()}
    if gpu:
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
            "visible_gpus": torch.cuda.device_count(),
        }
    return info


def default_work_root() -> Path:
    """Where the check works by default: build/ in this checkout (git-ignored, on the disk the checkout is on)."""
    root = REPO / "build"
    root.mkdir(exist_ok=True)
    return root


def child_environ(environ, *, gpu: bool) -> dict:
    """The environment of the probe and the smoke runs: offline, unbuffered, and on the accelerator under test. On a
    GPU no DS_ACCELERATOR at all (DeepSpeed picks CUDA itself): an inherited DS_ACCELERATOR=cpu (tests/conftest.py
    sets one for the whole test run; a shell may too) would train every "GPU" run on the CPU, and pass."""
    env = dict(environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if gpu:
        env.pop("DS_ACCELERATOR", None)
    else:
        env["DS_ACCELERATOR"] = "cpu"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check.json", help="the JSON written (default gpu-check.json)")
    parser.add_argument("--work", help="folder for the model, the runs and the probe cache (default: under build/)")
    parser.add_argument("--cpu", action="store_true", help="DeepSpeed's CPU accelerator even with a GPU")
    parser.add_argument("--strategies", help="STAGE:OPTIMIZER:PARAM,... (default: every family on a GPU)")
    parser.add_argument("--steps", type=int, help="optimizer steps per smoke run (default 5 on a GPU, 2 on CPU)")
    parser.add_argument("--quick-probe", action="store_true", help="the probe's small sizes (seconds)")
    parser.add_argument("--no-nvme", action="store_true", help="leave NVMe out (probe and strategies)")
    parser.add_argument("--own-cache", action="store_true", help="cache the probe under --work, not for this user")
    args = parser.parse_args(argv)

    import torch

    started = time.monotonic()
    gpu = torch.cuda.is_available() and not args.cpu
    env = child_environ(os.environ, gpu=gpu)
    # on a real disk: /tmp is tmpfs on many hosts, which the tool refuses as an NVMe folder (it lives in RAM)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-", dir=default_work_root()))
    work.mkdir(parents=True, exist_ok=True)
    if args.own_cache:  # the plans read the probe from the tool's cache: keep both under --work
        env.setdefault("TORCH_EXTENSIONS_DIR", default_extensions_dir())  # compiled ops stay shared
        env["XDG_CACHE_HOME"] = str(work / "cache")
    workload = dict(GPU_WORKLOAD if gpu else CPU_WORKLOAD)
    if args.steps:
        workload["steps"] = args.steps
    strategies = parse_strategies(args.strategies or ",".join(GPU_STRATEGIES if gpu else CPU_STRATEGIES))
    shape = GPU_MODEL if gpu else CPU_MODEL
    has_aio = not args.no_nvme and aio_usable()

    log(f"{'GPU ' + torch.cuda.get_device_name(0) if gpu else 'CPU accelerator'}; work folder {work}")
    model = make_model(work / "model", shape)
    data = work / "train.jsonl"
    shutil.copyfile(DEMO_TEXT, data)
    nvme = None
    if has_aio:
        nvme = work / "nvme-probe"
        nvme.mkdir(exist_ok=True)
    log("probe ...")
    tokens = workload["seq_len"] * workload["micro_batch"]
    probed = probe(model, tokens, env, quick=args.quick_probe or not gpu, nvme=nvme)
    if not probed["ok"] and nvme is not None:  # the NVMe part alone failing must not fail every strategy
        log("probe FAILED with the NVMe folder; probing again without it (the NVMe strategy is then skipped)")
        probed = probe(model, tokens, env, quick=args.quick_probe or not gpu, nvme=None) | {"nvme_error": probed}
        has_aio = False
    log(f"probe {'done' if probed['ok'] else 'FAILED'} in {probed['seconds']:.0f} s")

    runs = []
    for strategy in strategies:
        name = "zero{}-{}-{}".format(*strategy)
        if "nvme" in strategy[1:] and not has_aio:
            why = (
                "--no-nvme"
                if args.no_nvme
                else "the NVMe probe failed (see probe.nvme_error)"
                if "nvme_error" in probed
                else "DeepSpeed's async_io is not usable here (libaio missing)"
            )
            runs.append({"strategy": name, "skipped": why})
            log(f"{name}: skipped (no libaio)")
            continue
        log(f"{name}: smoke run ...")
        record = smoke_run(model, data, work / "runs" / name, strategy, workload, env, gpu=gpu)
        runs.append(record)
        gpu_band, step = record.get("gpu_bytes_per_device", {}), record.get("step_seconds", {})
        log(
            f"{name}: {'pass' if record.get('passed') else 'FAIL'} in {record['seconds']:.0f} s; "
            f"GPU {gpu_band.get('measured_over_predicted')}, step {step.get('measured_over_predicted')}"
        )

    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device_info(gpu),
        "versions": versions(),
        "model": {"shape": shape, "layers_kept": 1, "tokenizer_vocab": 384},
        "workload": workload,
        "probe": probed,
        "runs": runs,
        "passed": probed["ok"] and all(r.get("passed") for r in runs if "skipped" not in r),
        "seconds": time.monotonic() - started,
    }
    log(f"measured / predicted (! outside memory {MEMORY_BAND}, step {STEP_BAND}):\n{table(runs)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out} ({'passed' if result['passed'] else 'FAILED'}) in {result['seconds']:.0f} s")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
