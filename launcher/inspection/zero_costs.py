"""ZeRO's own cost per parameter tensor, measured on this host under DeepSpeed itself.

What ZeRO adds to the passes beyond the model's own work is mostly per parameter tensor and bound by one CPU
thread: ZeRO-3's fetch/release hooks on every module and pass (partitioned_param_coordinator.py), its copy of
each offloaded parameter in and out, ZeRO-1/2's gradient hook per parameter (stage_1_and_2.py
reduce_ready_partitions_and_remove_grads; with the optimizer offloaded, the copy of each gradient into the CPU
partition). Those costs scale with the host's single-thread speed, not with FLOPs or bandwidth, so the
step-time model (timing.py [DS-hooks]) takes them from this measurement when the probe has made it, and from
constants measured on the development machine otherwise.

How: a small Llama (PROBE_MODEL: 57 parameter tensors of small matrices, so that the per-parameter work is
a few per cent of the whole) is trained in a subprocess with world size 1, once per ZeRO family (FAMILIES), each
under the ds_config offload-launch itself writes for that strategy (planner + dsconfig.render), and once without
DeepSpeed (inspection/passes.build_cut), with and without activation checkpointing, all taking turns. The
median forward + backward with DeepSpeed less the bare model's median, less the per-parameter part the model
charges anyway (timing.zero_param_seconds), over the tensors, is each family's seconds per tensor per
micro-batch. Measured so on this machine (2 cores): ZeRO-3's hooks 2.4 ms per tensor, 2.65 ms with activation
checkpointing (1.1x, not the 1.5x a third pass would cost: the backward finds the recomputed forward's
parameters still gathered), its fetch from CPU memory 0.02-0.09 ms, ZeRO-2's hook 0.16-0.25 ms, 0.31-0.40 ms
with the optimizer offloaded. Bounded: about 15 s on two cores, DeepSpeed's import included.

`python -m launcher.inspection.zero_costs` prints the figures as one JSON object (the probe runs it so, as a
rank is run: DeepSpeed's process group and accelerator stay out of the calling process).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# A Llama-shaped model small enough that its passes are mostly framework: 6 blocks of 9 tensors + 3.
PROBE_MODEL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
MICRO_BATCH, SEQ_LEN = 2, 32
# family -> (ZeRO stage, optimizer offload, parameter offload, activation checkpointing): the costs
# timing.ZERO_TENSOR_SECONDS names
FAMILIES = {
    "zero12_hook": ("2", "none", "none", False),
    "offload_hook": ("2", "cpu", "none", False),
    "zero3_hook": ("3", "none", "none", False),
    "zero3_hook_recompute": ("3", "none", "none", True),
    "zero3_fetch": ("3", "cpu", "cpu", False),  # less zero3_hook: what offloading the parameters adds
}
WARMUP, REPEATS = 2, 9
TIMEOUT_SECONDS = 180  # the subprocess, DeepSpeed's import and a first JIT load of cpu_adam included


def measure(cpu_memory_bytes_per_s: float, log=lambda _line: None) -> dict | None:
    """{family: seconds per parameter tensor per micro-batch (timing.ZERO_TENSOR_SECONDS' names)} plus
    "device" and "tensors", measured in a subprocess; None (and a line to `log`) when it could not run.
    `cpu_memory_bytes_per_s`: the host's measured bandwidth, at which the per-parameter part is charged."""
    from launcher.job.launch import free_port

    rank = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    env = {**os.environ, **rank}  # a one-rank process group on a port nobody listens on
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.inspection.zero_costs", str(cpu_memory_bytes_per_s)],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        log(f"ZeRO's per-tensor cost: not measured (over {TIMEOUT_SECONDS} s); the plan uses nominal figures")
        return None
    figures = _figures(proc.stdout) if proc.returncode == 0 else None
    if figures is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"ZeRO's per-tensor cost: not measured ({last}); the plan uses nominal figures")
    return figures


def _figures(stdout: str) -> dict | None:
    """The subprocess's JSON line (DeepSpeed may print lines of its own around it); None when there is none."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            figures = json.loads(line)
        except ValueError:
            continue
        if isinstance(figures, dict) and "device" in figures:
            return figures
    return None


def per_tensor_costs(deltas: dict, tensors: int, param_seconds: dict) -> dict:
    """Each family's seconds per tensor per micro-batch from its passes' excess over the bare model (`deltas`,
    seconds per micro-batch) less the per-parameter part (`param_seconds`, the same unit); the fetch as what
    offloading the parameters adds to ZeRO-3's hooks."""
    per = {f: max(0.0, deltas[f] - param_seconds[f]) / tensors for f in deltas}
    per["zero3_fetch"] = max(0.0, per["zero3_fetch"] - per["zero3_hook"])
    # ZeRO-3's hooks cannot cost nothing: a zero there is a machine too busy to measure it (the family is left out,
    # and the plan keeps its nominal figure); the others may be near zero
    return {f: v for f, v in per.items() if v > 0 or f not in ("zero3_hook", "zero3_hook_recompute")}


def _ds_config(profile, host, family: str) -> dict:
    """The ds_config offload-launch writes for this family's strategy on this host (pinned, so that it is chosen)."""
    from launcher.config.dsconfig import render
    from launcher.plan.planner import make_plan
    from launcher.plan.workload import Workload

    stage, optimizer, param, _ = FAMILIES[family]
    workload = Workload(
        seq_len=SEQ_LEN,
        micro_batch=MICRO_BATCH,
        activation_checkpointing=False,  # the model below is checkpointed or not; the config says nothing of it
        zero_stage=stage,
        offload_optimizer=optimizer,
        offload_param=param,
        steps=WARMUP + REPEATS,
    )
    return render(make_plan(profile, host, workload))


def _engine_pass(config: dict, model_config, device: str, recompute: bool):
    """A DeepSpeed engine under `config` on a fresh model (checkpointed as the trainer does it, or not), and a
    function timing one forward + backward of it (the optimizer steps after each, untimed, as in training)."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from launcher.inspection.passes import enable_recompute

    model = AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16)
    if recompute:
        enable_recompute(model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
    ids = torch.randint(0, model_config.vocab_size, (MICRO_BATCH, SEQ_LEN), device=engine.device)

    def timed() -> float:
        start = time.perf_counter()
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        engine.step()
        return seconds

    return timed


def time_rounds(passes: dict, warmup: int = WARMUP, repeats: int = REPEATS) -> dict:
    """Each timed pass's median over `repeats` rounds after `warmup`, all taking turns within a round: a drift of
    the machine's speed (another process, the clock) then hits every family and the bare model alike."""
    seconds: dict = {name: [] for name in passes}
    for round_ in range(warmup + repeats):
        for name, timed in passes.items():
            took = timed()
            if round_ >= warmup:
                seconds[name].append(took)
    return {name: statistics.median(times) for name, times in seconds.items()}


def _main() -> None:
    import warnings

    import deepspeed
    import torch
    from transformers import LlamaConfig

    from launcher.inspection.host import inspect_host
    from launcher.inspection.model import inspect_model
    from launcher.inspection.passes import build_cut
    from launcher.plan.timing import zero_param_seconds

    warnings.filterwarnings("ignore")
    host = inspect_host(None)
    device = "cuda" if host.has_gpu else "cpu"
    model_config = LlamaConfig(**PROBE_MODEL)
    with tempfile.TemporaryDirectory(prefix="offload-launch-zero-costs-") as folder:
        model_config.save_pretrained(folder)
        profile = inspect_model(folder)
        configs = {family: _ds_config(profile, host, family) for family in FAMILIES}
    deepspeed.init_distributed()
    passes = {f: _engine_pass(configs[f], model_config, device, FAMILIES[f][3]) for f in FAMILIES}
    for recompute in (False, True):  # the bare model, with and without activation checkpointing
        bare = build_cut(model_config, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, recompute=recompute, device=device)
        passes[("bare", recompute)] = bare
    medians = time_rounds(passes)
    deltas = {f: medians[f] - medians[("bare", FAMILIES[f][3])] for f in FAMILIES}
    baseline = medians[("bare", False)]
    bandwidth = float(sys.argv[1])
    param_seconds = {
        family: zero_param_seconds(profile.params, int(stage) >= 3, optimizer, param, bandwidth, host.has_gpu)
        for family, (stage, optimizer, param, _) in FAMILIES.items()
    }
    tensors = len(profile.param_numels)
    costs = per_tensor_costs(deltas, tensors, param_seconds)
    print(json.dumps(costs | {"device": device, "tensors": tensors, "baseline_seconds": baseline}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _main()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads racing interpreter teardown abort it (rank/__main__.py says why)
