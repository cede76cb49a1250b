"""Time DeepSpeed engines under the ds_configs handed in, against the bare model, in a subprocess.

ZeRO's own cost per parameter tensor, measured on this host under DeepSpeed itself.

What ZeRO adds to the passes beyond the model's own work is mostly per parameter tensor and bound by one CPU
thread: ZeRO-3's fetch/release hooks on every module and pass (partitioned_param_coordinator.py), its copy of
each offloaded parameter in and out, ZeRO-1/2's gradient hook per parameter (stage_1_and_2.py
reduce_ready_partitions_and_remove_grads; with the optimizer offloaded, the copy of each gradient into the CPU
partition). Those costs scale with the host's single-thread speed, not with FLOPs or bandwidth, so the
step-time model (framework.py [DS-hooks]) takes them from this measurement when the probe has made it, and from
constants measured on the development machine otherwise.

How: a small Llama (PROBE_MODEL: 57 parameter tensors of small matrices, so that the per-parameter work is
a few per cent of the whole) is trained in a subprocess with world size 1, once per ZeRO family (FAMILIES), each
under the ds_config offload-launch itself writes for that strategy (built by the caller, job/measuring.py: the
planner + dsconfig.render; this stage never plans), and once without DeepSpeed (measure/passes.build_cut), with and
without activation checkpointing, all taking turns. The subprocess prints each pass's median (`measure`); the
caller subtracts the bare model's median and the per-parameter part the model charges anyway
(framework.zero_param_seconds) and divides by the tensors (`per_tensor_costs`): each family's seconds per tensor
per micro-batch. Measured so on this machine (2 cores): ZeRO-3's hooks 2.4 ms per tensor, 2.65 ms with activation
checkpointing (1.1x, not the 1.5x a third pass would cost: the backward finds the recomputed forward's
parameters still gathered), its fetch from CPU memory 0.02-0.09 ms, ZeRO-2's hook 0.16-0.25 ms, 0.31-0.40 ms
with the optimizer offloaded. Bounded: about 15 s on two cores, DeepSpeed's import included.

`python -m launcher.measure.zero_costs FOLDER DEVICE` prints the medians as one JSON object (the caller runs it so, as
a rank is run: DeepSpeed's process group and accelerator stay out of the calling process). FOLDER holds the probe
model's config.json and `ds_configs.json`, {family: ds_config} (write_model, write_configs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
# rates.ZERO_TENSOR_SECONDS names
FAMILIES = {
    "zero12_hook": ("2", "none", "none", False),
    "offload_hook": ("2", "cpu", "none", False),
    "zero3_hook": ("3", "none", "none", False),
    "zero3_hook_recompute": ("3", "none", "none", True),
    "zero3_fetch": ("3", "cpu", "cpu", False),  # less zero3_hook: what offloading the parameters adds
}
BARE = {False: "bare", True: "bare_recompute"}  # the model without DeepSpeed, by activation checkpointing
WARMUP, REPEATS = 2, 9
TIMEOUT_SECONDS = 180  # the subprocess, DeepSpeed's import and a first JIT load of cpu_adam included


def write_model(folder: Path) -> None:
    """The probe model's config.json (PROBE_MODEL) in `folder`, where the subprocess builds it from."""
    from transformers import LlamaConfig

    LlamaConfig(**PROBE_MODEL).save_pretrained(folder)


def write_configs(folder: Path, configs: dict) -> None:
    """{family: ds_config} in `folder`, where the subprocess reads the configs its engines run under."""
    (folder / "ds_configs.json").write_text(json.dumps(configs))


def measure(folder: Path, device: str, port: int, log=lambda _line: None) -> dict | None:
    """{"medians": {family or "bare"/"bare_recompute": seconds per forward + backward}, "device"}, timed in a
    subprocess on the inputs in `folder` (write_model, write_configs), a one-rank process group on `port`; None
    (and a line to `log`) when it could not run."""
    rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env = {**os.environ, **rank}  # a one-rank process group on a port nobody listens on
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.measure.zero_costs", str(folder), device],
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


def excess_seconds(medians: dict) -> dict:
    """Each family's median forward + backward less the bare model's (checkpointed as the family is): seconds per
    micro-batch that DeepSpeed adds."""
    return {f: medians[f] - medians[BARE[FAMILIES[f][3]]] for f in FAMILIES}


def per_tensor_costs(deltas: dict, tensors: int, param_seconds: dict) -> dict:
    """Each family's seconds per tensor per micro-batch from its passes' excess over the bare model (`deltas`,
    seconds per micro-batch) less the per-parameter part (`param_seconds`, the same unit); the fetch as what
    offloading the parameters adds to ZeRO-3's hooks."""
    per = {f: max(0.0, deltas[f] - param_seconds[f]) / tensors for f in deltas}
    per["zero3_fetch"] = max(0.0, per["zero3_fetch"] - per["zero3_hook"])
    # ZeRO-3's hooks cannot cost nothing: a zero there is a machine too busy to measure it (the family is left out,
    # and the plan keeps its nominal figure); the others may be near zero
    return {f: v for f, v in per.items() if v > 0 or f not in ("zero3_hook", "zero3_hook_recompute")}


def _engine_pass(config: dict, model_config, device: str, recompute: bool):
    """A DeepSpeed engine under `config` on a fresh model (checkpointed as the trainer does it, or not), and a
    function timing one forward + backward of it (the optimizer steps after each, untimed, as in training)."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from launcher.measure.passes import enable_recompute

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
    from transformers import AutoConfig

    from launcher.cpuinfo_once import ask_cpuinfo_once
    from launcher.measure.passes import build_cut

    ask_cpuinfo_once()  # before deepspeed.initialize loads cpu_adam
    warnings.filterwarnings("ignore")
    folder, device = Path(sys.argv[1]), sys.argv[2]
    model_config = AutoConfig.from_pretrained(folder)
    configs = json.loads((folder / "ds_configs.json").read_text())
    deepspeed.init_distributed()
    passes = {f: _engine_pass(configs[f], model_config, device, FAMILIES[f][3]) for f in FAMILIES}
    for recompute in (False, True):  # the bare model, with and without activation checkpointing
        bare = build_cut(model_config, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, recompute=recompute, device=device)
        passes[BARE[recompute]] = bare
    print(json.dumps({"medians": time_rounds(passes), "device": device}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _main()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads racing interpreter teardown abort it (rank/__main__.py says why)
