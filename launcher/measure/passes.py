"""Time the model cut to one and three blocks at the workload's tokens: seconds per block and for the rest.

The passes measured at the model's shapes: a forward and backward of the model cut to one and to three
transformer blocks, at the run's micro-batch and sequence length, on the device and with the threads a rank
will have. Their difference is one block; the rest (embedding, head, loss, the framework's per-pass cost) is
what is left of the one-block time. The step-time model then charges L blocks plus the rest per micro-batch
(compute.compute_seconds), which carries everything FLOP counts miss at small shapes: attention, kernel and
operator dispatch, normalisations, the loss over the vocabulary.

An encoder-decoder (T5, BART) is cut to as many blocks in each stack, and timed on a source and a target of the
sequence length each (labels = the inputs, as its trainer feeds it); a block is then the mean of an encoder and a
decoder block, which the model charges for both stacks' blocks. A model of kind "other" (BERT: no LM head, and no
training here) is not timed: the plan counts FLOPs.

Bounded by the caller (job/measuring.py): skipped, and the model falls back to FLOPs, when timing the cuts (a
warm-up and REPEATS rounds of both) would take more than its budget by FLOPs. Cached (measure/cache.py) per host,
model config, shape, device, threads and torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from launcher.inspection.model import CAUSAL_LM, OTHER, auto_class
from launcher.measure.contention import contended, gauged

# blocks in the two cuts (the second no more than the model has): apart, so that a block stands out of the noise
CUT_LAYERS = (1, 3)
REPEATS = 7  # rounds; each cut's median counts
ESTIMATOR = "median"  # in the cache key: figures cached when the best round counted are measured again


def cut_config(config_dir: str, layers: int, trust_remote_code: bool):
    """The model's config (a folder holding config.json, or a bundled .json) cut to `layers` blocks."""
    from launcher.inspection.model_config import cut_to_layers, load_config

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


def cut_layers(profile) -> tuple[int, int] | None:
    """Blocks per stack in the two cuts of `profile`'s model (the second no more than its deepest stack has); None
    for a model of kind "other" (not trained here) or one block deep (nothing to tell a block from the rest)."""
    if profile.kind == OTHER:
        return None
    depth = max(profile.encoder_layers, profile.cross_attention_layers) or profile.num_layers  # the deepest stack
    layers = (CUT_LAYERS[0], min(CUT_LAYERS[1], depth))
    return None if layers[1] == layers[0] else layers


def time_passes(
    profile,
    layers: tuple[int, int],
    *,
    micro_batch: int,
    seq_len: int,
    recompute: bool,
    device: str,
    threads: int,
    log: Callable[[str], None],
    trust_remote_code: bool = False,
) -> dict | None:
    """{"per_layer_seconds", "fixed_seconds", "tokens", ...}: `profile`'s model (a ModelProfile) cut to `layers`
    blocks per stack (cut_layers), timed at this workload with `threads` threads; None (and a line to `log`) when the
    cuts cannot be built or trained here. Whether the cuts are worth their time is the caller's to decide."""
    import torch

    log(f"measuring the passes at the model's shapes ({micro_batch} x {seq_len} tokens, {threads} threads) ...")
    blocks = [cut_blocks(profile, n) for n in layers]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cuts = [
            build_cut(
                cut_config(profile.config_dir, n, trust_remote_code),
                micro_batch=micro_batch,
                seq_len=seq_len,
                recompute=recompute,
                device=device,
                kind=profile.kind,
            )
            for n in layers
        ]
        # contention.py: on the CPU the host's cores time it, gauged before and after
        seconds, share = gauged(lambda: time_cuts(cuts), threads) if device == "cpu" else (time_cuts(cuts), None)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # not buildable (or not trainable) here
        log(f"could not time the passes at the model's shapes ({exc}); the plan counts FLOPs")
        return None
    finally:
        torch.set_num_threads(previous)
    per_layer = max(0.0, (seconds[1] - seconds[0]) / (blocks[1] - blocks[0]))
    return {
        "per_layer_seconds": per_layer,
        "fixed_seconds": max(0.0, seconds[0] - blocks[0] * per_layer),
        "tokens": micro_batch * seq_len,
        "cut_layers": list(layers),  # per stack
        "cut_blocks": blocks,  # both stacks
        "cut_seconds": seconds,
        "device": device,
        "threads": threads,
        # contention.py: the share of its threads' cores the timing got (on a GPU the host's cores do not time it)
        "core_share": share,
        "contended": contended(share),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
