"""The passes measured at the model's shapes: a forward and backward of the model cut to one and to three
transformer blocks, at the run's micro-batch and sequence length, on the device and with the threads a rank
will have. Their difference is one block; the rest (embedding, head, loss, the framework's per-pass cost) is
what is left of the one-block time. The step-time model then charges L blocks plus the rest per micro-batch
(timing.compute_seconds), which carries everything FLOP counts miss at small shapes: attention, kernel and
operator dispatch, normalisations, the loss over the vocabulary.

An encoder-decoder (T5, BART) is cut to as many blocks in each stack, and timed on a source and a target of the
sequence length each (labels = the inputs, as its trainer feeds it); a block is then the mean of an encoder and a
decoder block, which the model charges for both stacks' blocks. A model of kind "other" (BERT: no LM head, and no
training here) is not timed: the plan counts FLOPs.

Bounded: skipped (None, and the model falls back to FLOPs) when timing the cuts (a warm-up and REPEATS rounds of
both) would take more than BUDGET_SECONDS by FLOPs at `flops_per_s`. Cached per host, model config, shape, device,
threads and torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from launcher.files import write_json_atomic
from launcher.inspection.model import CAUSAL_LM, OTHER, auto_class

BUDGET_SECONDS = 15.0  # the whole measurement: a warm-up and REPEATS timed passes of each cut
# blocks in the two cuts (the second no more than the model has): apart, so that a block stands out of the noise
CUT_LAYERS = (1, 3)
REPEATS = 7  # rounds; each cut's median counts
ESTIMATOR = "median"  # in the cache key: figures cached when the best round counted are measured again


def cache_key(
    config: dict, *, host_id: str, device: str, threads: int, tokens: tuple[int, int], recompute: bool
) -> str:
    import torch

    identity = json.dumps(
        [config, host_id, device, threads, list(tokens), recompute, torch.__version__, CUT_LAYERS, ESTIMATOR],
        sort_keys=True,
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def cut_config(config_dir: str, layers: int, trust_remote_code: bool):
    """The model's config (a folder holding config.json, or a bundled .json) cut to `layers` blocks."""
    from launcher.inspection.model import cut_to_layers, load_config

    config = load_config(Path(config_dir), trust_remote_code)
    cut_to_layers(config, layers)
    config.use_cache = False
    return config


def enable_recompute(model) -> None:
    """Activation checkpointing as the trainer turns it on (non-reentrant); transformers 5.x renamed
    gradient_checkpointing_enable and its kwargs argument."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def cut_blocks(profile, layers: int) -> int:
    """Blocks in `profile`'s model cut to `layers` per stack (cut_to_layers): an encoder-decoder's in both stacks."""
    if profile.cross_attention_layers:
        return min(layers, profile.encoder_layers) + min(layers, profile.cross_attention_layers)
    return min(layers, profile.num_layers)


def build_cut(
    config, *, micro_batch: int, seq_len: int, recompute: bool, device: str, kind: str = CAUSAL_LM
) -> Callable[[], float]:
    """A model built from `config` (random bf16 weights) by its kind's auto class, and a function timing one forward
    + backward of it: a causal LM on `seq_len` tokens, an encoder-decoder on a source and a target of `seq_len`
    tokens each (labels = input_ids; the decoder's inputs are the labels shifted right)."""
    import torch

    model = auto_class(kind).from_config(config, dtype=torch.bfloat16).to(device)
    model.train()
    if recompute:
        enable_recompute(model)
    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len), device=device)

    def timed() -> float:
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    timed()  # warm-up: allocations, kernels, autotuning
    return timed


def time_cuts(cuts: list[Callable[[], float]], repeats: int = REPEATS) -> list[float]:
    """Each cut's median time over `repeats` rounds, the cuts taking turns within a round: a drift of the machine's
    speed (frequency, another process) then hits both alike instead of one. The median, not the best: the trainer
    reports a step's median (rank/progress.py), and on a shared host whose speed swings (the development machine,
    idle: a tiny model's pass 14-27 ms within a minute) the best round predicts the fastest moment, not a step."""
    seconds: list[list[float]] = [[] for _ in cuts]
    for _ in range(repeats):
        for times, cut in zip(seconds, cuts, strict=True):
            times.append(cut())
    return [statistics.median(times) for times in seconds]


def measure_passes(
    profile,
    *,
    micro_batch: int,
    seq_len: int,
    recompute: bool,
    device: str,
    threads: int,
    flops_per_s: float,
    host_id: str,
    cache_dir: Path,
    log: Callable[[str], None],
    measure: bool = True,
    trust_remote_code: bool = False,
) -> dict | None:
    """{"per_layer_seconds", "fixed_seconds", "tokens", ...} for `profile` (a ModelProfile) at this workload, from
    the cache or (`measure`) measured now; None when not cached and not measured, when the cuts would take too
    long, when they cannot be built, or for a model of kind "other" (not trained here)."""
    from launcher.plan.timing import flops_per_token

    if profile.kind == OTHER:
        return None
    location = Path(profile.config_dir)
    config_json = json.loads((location if location.is_file() else location / "config.json").read_text())
    key = cache_key(
        config_json,
        host_id=host_id,
        device=device,
        threads=threads,
        tokens=(micro_batch, seq_len),
        recompute=recompute,
    )
    path = cache_dir / "passes" / f"{key}.json"
    with contextlib.suppress(OSError, ValueError):  # not cached yet, or a damaged file: measured again
        return json.loads(path.read_text())
    if not measure:
        return None
    depth = max(profile.encoder_layers, profile.cross_attention_layers) or profile.num_layers  # the deepest stack
    cut_layers = (1, min(CUT_LAYERS[1], depth))
    if cut_layers[1] == cut_layers[0]:
        return None  # one block: nothing to tell a block from the rest
    blocks = [cut_blocks(profile, layers) for layers in cut_layers]
    embeddings = max(0, profile.params - profile.num_layers * profile.layer_params)
    cut_params = embeddings + blocks[1] * profile.layer_params
    tokens = micro_batch * seq_len
    cross = min(cut_layers[1], profile.cross_attention_layers)
    cut = flops_per_token(cut_params, recompute, blocks[1], profile.attention_dim, seq_len, cross) * tokens
    if cut / flops_per_s * (1 + REPEATS) * 2 > BUDGET_SECONDS:
        return None
    log(f"measuring the passes at the model's shapes ({micro_batch} x {seq_len} tokens, {threads} threads) ...")
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cuts = [
            build_cut(
                cut_config(profile.config_dir, layers, trust_remote_code),
                micro_batch=micro_batch,
                seq_len=seq_len,
                recompute=recompute,
                device=device,
                kind=profile.kind,
            )
            for layers in cut_layers
        ]
        seconds = time_cuts(cuts)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # not buildable (or not trainable) here
        log(f"could not time the passes at the model's shapes ({exc}); the plan counts FLOPs")
        return None
    finally:
        torch.set_num_threads(previous)
    per_layer = max(0.0, (seconds[1] - seconds[0]) / (blocks[1] - blocks[0]))
    result = {
        "per_layer_seconds": per_layer,
        "fixed_seconds": max(0.0, seconds[0] - blocks[0] * per_layer),
        "tokens": tokens,
        "cut_layers": list(cut_layers),  # per stack
        "cut_blocks": blocks,  # both stacks
        "cut_seconds": seconds,
        "device": device,
        "threads": threads,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(path, result)
    return result
