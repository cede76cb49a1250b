"""Memory model: bytes per tier for one strategy.

The tiers: per GPU, CPU RAM per node, NVMe per node. One function per term, each citing its source.
Notation: P = parameters, N = data-parallel world size (all ranks), R = ranks per node, s = sequence length,
b = micro-batch, h = hidden size, L = layers, V = vocabulary. bf16 and fp16 are both 2 bytes.

Sources (the strategy's byte widths: strategy.py [seeds], [DS-bf16s]; the sub-groups a partial offload splits:
subgroups.py [Twin-Flow]; the offload machinery's host buffers and processes: host_buffers.py [DS-swap], [DS-lazy],
[DS-pin], [torch-host], [act-offload], [ZenFlow], [SuperOffload]):
  [ZeRO]    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
            Models", Fig. 1: stage 1 partitions the 12 B optimizer states, stage 2 also the 2 B grads,
            stage 3 also the 2 B weights, each by N.
  [DS-fp32g] DeepSpeed stage_1_and_2.py / stage3.py: the optimizer's gradient partition is fp32
            (4 B per partitioned param) on the optimizer's device (`single_partition_of_fp32_groups`,
            `fp32_partitioned_groups_flat`); DeepSpeed's own estimators count 16 (stage 2 offload) and
            18 (stage 3 offload) B/param on CPU, i.e. 12 + 4 (+2 fp16 params).
  [DS-docs] deepspeed.ai/docs/config-json, overlap_comm: "uses 4.5x the allgather_bucket_size and
            reduce_bucket_size values ... 5e8 x 2Bytes x 2 x 4.5".
  [Korth]   Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
            eq. 1: activations per layer = s·b·h·(34 + 5·a·s/h) bytes; the 5·a·s²·b score term is not
            stored by SDPA/FlashAttention (Dao et al. 2022), which transformers uses by default (for T5, BART
            and BERT too: transformers 5.24 builds them with attn_implementation "sdpa"). §4.1 itemises the 34:
            attention 11·s·b·h (the q/k/v projections' shared input 2, Q and K 4, V 2, the output projection's
            input 2, its dropout mask 1), MLP 19·s·b·h (input 2, the 4h-wide activation's input 8 and the second
            linear's input 8, dropout mask 1), two layer norms' inputs 4·s·b·h. The terms it writes in h are
            at the attention's inner width d = a·d_head (Q, K, V and the output projection's input: 8·s·b·d),
            which the paper takes equal to h, as for every causal LM bundled here; T5-11B's is 16·h. So a
            block holds s·b·(26·h + 8·d), 34·s·b·h where d = h. The MLP stays the paper's 4h-wide one: T5-11B's
            64h-wide MLP holds more than counted (docs/planning.md "Model families").
  [enc-dec] An encoder-decoder (Vaswani et al. 2017, §3.1-3.2; Raffel et al. 2020, "Exploring the Limits of
            Transfer Learning with a Unified Text-to-Text Transformer" (T5), §3.1.1: "the encoder and decoder
            are each similar in size and configuration to a BERT-BASE stack"; Hugging Face's T5 docs: the
            model is trained with input_ids (the source) and labels (the target)) runs the source through the
            encoder blocks and the target through the decoder blocks, each of which adds a cross-attention
            sublayer: queries from the target, keys and values from the encoder's output. The planner takes
            --seq-len s as s source and s target tokens (an assumption: where the targets are shorter, as in
            T5's span-corruption pre-training, it errs on the side of more decoder work and memory). A
            cross-attention sublayer holds [Korth]'s attention
            terms and a layer norm's input: s·b·(5·h + 8·d) bytes (13·s·b·h where d = h); the encoder's output,
            which every decoder block reads, is held once (2·s·b·h). One stack (a causal LM, an encoder such as
            BERT) is the case of no cross-attention sublayers.
  [DS-frozen] DeepSpeed utils.py `is_optimized_parameter` (requires_grad and numel > 0): frozen parameters are left
            out of the optimizer's groups, so ZeRO builds 16-bit gradients, fp32 masters, gradient partitions and
            Adam states for the trainable ones only (stage_1_and_2.py __init__'s `bit16_groups`, stage3.py
            `_get_trainable_parameter_groups`). The frozen weights stay where the stage puts every weight: whole on
            every GPU at ZeRO-1/2 (engine.py `_configure_distributed_model` moves the module to the device; only
            stage 3 takes offload_param), partitioned over N (and offloadable) at ZeRO-3, which converts every
            module parameter, frozen or not (parameter_offload.py `_convert_to_zero_parameters`).
  [DS-live] DeepSpeed partitioned_param_coordinator.py: `fetch_sub_module` gathers the current module's
            params unconditionally, then prefetches `min(max_n_available_params - n_available_params,
            prefetch_bucket_sz)` elements (the loop overshoots by one param); `__params_to_release` keeps every
            param used again within `max_reuse_distance_in_numel` elements of the trace (those count in
            n_available_params too). Live gathered elements <= max(stage3_max_live_parameters,
            stage3_max_reuse_distance) + current module + one overshooting param.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.plan import peaks
from launcher.plan.host_buffers import (
    PROCESS_BASELINE_BYTES_CPU,
    PROCESS_BASELINE_BYTES_CUDA,
    offload_host_terms,
    zenflow_device_terms,
)
from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import (
    BYTES_16BIT,
    BYTES_FP32,
    DS_MAX_LIVE_PARAMETERS,
    OPTIMIZER_BYTES_PER_PARAM,
    Buckets,
    Strategy,
)
from launcher.plan.subgroups import optimizer_gpu_share
from launcher.units import GiB

OVERLAP_COMM_FACTOR = 4.5  # [DS-docs]
CUDA_CONTEXT_BYTES = 1 * GiB  # CUDA context + cuBLAS/NCCL workspaces, measured ~0.5-1 GiB on A100/H100


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per tier, term by term, so a table can show where the memory goes: the terms are the steady state (from
    the first optimizer step on); the moments (peaks.py) are each tier's total at every moment of a run, and what a
    tier needs is their peak."""

    gpu_terms: dict[str, int] = field(default_factory=dict)  # per device (GPU, or rank on CPU accelerator)
    cpu_terms: dict[str, int] = field(default_factory=dict)  # per node
    nvme_terms: dict[str, int] = field(default_factory=dict)  # per node
    cpu_moments: dict[str, int] = field(default_factory=dict)  # per node, by peaks.MOMENTS; {}: the steady state
    gpu_moments: dict[str, int] = field(default_factory=dict)  # per device, by peaks.MOMENTS; {}: the steady state

    @property
    def gpu_bytes_per_device(self) -> int:
        """At the peak moment."""
        return max(self.gpu_moments.values(), default=sum(self.gpu_terms.values()))

    @property
    def cpu_bytes(self) -> int:
        """At the peak moment."""
        return max(self.cpu_moments.values(), default=self.steady_cpu_bytes)

    @property
    def steady_cpu_bytes(self) -> int:
        return sum(self.cpu_terms.values())

    @property
    def cpu_peak_moment(self) -> str:
        return peaks.peak(self.cpu_moments)[0] if self.cpu_moments else peaks.STEP

    @property
    def gpu_peak_moment(self) -> str:
        return peaks.peak(self.gpu_moments)[0] if self.gpu_moments else peaks.STEP

    @property
    def nvme_bytes(self) -> int:
        return sum(self.nvme_terms.values())

    def to_json(self) -> dict:
        return {
            "gpu_bytes_per_device": self.gpu_bytes_per_device,
            "cpu_bytes": self.cpu_bytes,
            "nvme_bytes": self.nvme_bytes,
            "gpu_peak_moment": self.gpu_peak_moment,
            "cpu_peak_moment": self.cpu_peak_moment,
            "gpu_moments": dict(self.gpu_moments),
            "cpu_moments": dict(self.cpu_moments),
            "gpu_terms": dict(self.gpu_terms),
            "cpu_terms": dict(self.cpu_terms),
            "nvme_terms": dict(self.nvme_terms),
        }


# ------------------------------------------------------------------------------------- model states


def model_states(params: int, strategy: Strategy, world: int, trainable: int = 0) -> dict[str, dict[str, int]]:
    """The seeds' 16 B/param budget placed on tiers and partitioned by ZeRO stage (strategy.py [seeds], [ZeRO]).
    With an adapter ([DS-frozen]: `trainable` of the `params`) the 2 B weights are every parameter's, the
    gradients' 2 B and the optimizer's 12 B the trainable ones' only.

    Returns {"gpu": {...}, "cpu": {...}, "nvme": {...}} in bytes *per rank*. This is the textbook split
    (7B ZeRO-Offload: 14 GB GPU + 98 GB CPU); `estimate()` adds what DeepSpeed really allocates on top.
    """
    stage, n = strategy.zero_stage, world
    optimized = trainable or params
    weights = BYTES_16BIT * params // (n if stage >= 3 else 1)
    grads = BYTES_16BIT * optimized // (n if stage >= 2 else 1)
    # partitioned from stage 1 on; master, m, v of 2 B each with bf16 states (strategy.py [DS-bf16s])
    optimizer = OPTIMIZER_BYTES_PER_PARAM * optimized // n * strategy.state_bytes // BYTES_FP32
    tiers: dict[str, dict[str, int]] = {"gpu": {}, "cpu": {}, "nvme": {}}
    param_tier = "gpu" if strategy.offload_param == "none" else strategy.offload_param
    optimizer_tier = "gpu" if strategy.offload_optimizer == "none" else strategy.offload_optimizer
    tiers[param_tier]["fp16 weights"] = weights
    # With the optimizer offloaded, gradients stream to where the update runs (strategy.py [seeds] ZeRO-Offload).
    tiers[optimizer_tier]["fp16 gradients"] = grads if optimizer_tier == "gpu" else BYTES_16BIT * optimized // n
    tiers[optimizer_tier][strategy.states_term] = optimizer
    return tiers


def fp32_gradient_partition_bytes(params: int, world: int) -> int:
    """[DS-fp32g] the optimizer's fp32 view of the gradient partition: 4 B per partitioned param,
    replacing the 2 B fp16 gradient the seeds count where the optimizer lives off the GPU."""
    return BYTES_FP32 * params // world


# ------------------------------------------------------------------------------------- buffers


def comm_bucket_bytes(strategy: Strategy, buckets: Buckets) -> int:
    """Gradient reduce / parameter all-gather buckets on the device ([DS-docs] overlap_comm 4.5x)."""
    factor = OVERLAP_COMM_FACTOR if buckets.overlap_comm else 1.0
    if strategy.zero_stage >= 3:
        # stage 3: one reduce-scatter bucket (double-buffered with overlap) + the prefetch bucket.
        reduce = buckets.reduce_bucket_size * BYTES_16BIT * (2 if buckets.overlap_comm else 1)
        return int(reduce + buckets.prefetch_bucket_size * BYTES_16BIT)
    return int((buckets.reduce_bucket_size + buckets.allgather_bucket_size) * BYTES_16BIT * factor)


def live_param_numel(shape_params: int, persistent_params: int, largest_param_numel: int, buckets: Buckets) -> int:
    """ZeRO-3's live gathered parameters ([DS-live]): up to max(stage3_max_live_parameters,
    stage3_max_reuse_distance), plus the module being fetched and the prefetch loop's overshoot (each at most
    the largest tensor), never more than the partitioned (non-persistent) parameters."""
    bound = max(buckets.max_live_parameters, buckets.max_reuse_distance) + 2 * largest_param_numel
    return min(max(0, shape_params - persistent_params), bound)


def zero3_live_parameter_limit(layer_params: int) -> int:
    """A per-plan stage3_max_live_parameters / stage3_max_reuse_distance ([DS-live]): two of the largest
    blocks - the one in use and the next one prefetched; with activation checkpointing a block's params are
    used again (backward) within about two blocks of their recompute, so they are kept, not re-gathered -
    never above DeepSpeed's default. capacity.size_buckets sizes both keys with it and dsconfig writes them,
    so the live set the estimate counts is the one DeepSpeed keeps."""
    return min(DS_MAX_LIVE_PARAMETERS, 2 * layer_params)


def live_param_bytes(shape_params: int, persistent_params: int, largest_param_numel: int, buckets: Buckets) -> int:
    """[DS-live] the live gathered 16-bit parameters on each GPU."""
    return BYTES_16BIT * live_param_numel(shape_params, persistent_params, largest_param_numel, buckets)


def persistent_param_bytes(small_params: int) -> int:
    """ZeRO-3 keeps tensors below stage3_param_persistence_threshold whole on every rank."""
    return BYTES_16BIT * small_params


# ------------------------------------------------------------------------------------- activations


def activation_bytes(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    checkpointing: bool,
    *,
    cross_attention_layers: int = 0,
    attention_width: int = 0,
) -> int:
    """[Korth] s·b·(26·h + 8·d) bytes per block (34·s·b·h where the attention width d = h) without the
    attention-score term (SDPA), and [enc-dec] s·b·(5·h + 8·d) per cross-attention sublayer (13·s·b·h) plus the
    encoder's output once (2·s·b·h), each stack over its s tokens. With activation checkpointing only each block's
    2-byte input (and the encoder's output, every decoder block's other input) is kept, plus the largest block's
    activations while it is recomputed in backward."""
    tokens = seq_len * micro_batch
    d = attention_width or hidden
    block = (26 * hidden + 8 * d) * tokens
    cross = (5 * hidden + 8 * d) * tokens if cross_attention_layers else 0
    encoder_output = BYTES_16BIT * tokens * hidden if cross_attention_layers else 0
    if not checkpointing:
        return block * layers + cross * cross_attention_layers + encoder_output
    return BYTES_16BIT * tokens * hidden * layers + encoder_output + block + cross


def logits_bytes(seq_len: int, micro_batch: int, vocab: int) -> int:
    """Logits in 16-bit (2 B), upcast to fp32 for the loss (4 B) and its fp32 gradient (4 B), per token
    per vocabulary entry (transformers' ForCausalLMLoss upcasts logits to float)."""
    return seq_len * micro_batch * vocab * (BYTES_16BIT + BYTES_FP32 + BYTES_FP32)


# ------------------------------------------------------------------------------------- the estimate


def _states_by_tier(
    shape: ModelShape, strategy: Strategy, buckets: Buckets, world: int
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(GPU, CPU, NVMe) per-rank model states: model_states with the optimizer's gradient partition at its real
    width ([DS-fp32g]) and a partial offload's GPU share (subgroups.py [Twin-Flow]) moved to the device."""
    p, n = shape.optimized_params, world
    states = model_states(shape.params, strategy, n, shape.trainable_params)
    gpu: dict[str, int] = dict(states["gpu"])
    cpu_per_rank: dict[str, int] = dict(states["cpu"])
    nvme_per_rank: dict[str, int] = dict(states["nvme"])

    # The optimizer's gradient partition is fp32 where the optimizer lives off the GPU [DS-fp32g].
    if strategy.offload_optimizer != "none":
        tier = cpu_per_rank if strategy.offload_optimizer == "cpu" else nvme_per_rank
        tier.pop("fp16 gradients")
        tier[strategy.gradients_term] = fp32_gradient_partition_bytes(p, n) * strategy.state_bytes // BYTES_FP32
        share = optimizer_gpu_share(shape, strategy, buckets, n)
        if share:  # [Twin-Flow] the GPU's sub-groups: their master, m, v and gradient partition on the device
            for name in (strategy.states_term, strategy.gradients_term):
                gpu[f"{name} (GPU share)"] = int(tier[name] * share)
                tier[name] -= gpu[f"{name} (GPU share)"]
    else:
        # Built from the 16-bit gradients at step time while they still exist (stage_1_and_2.py step()).
        gpu["fp32 gradient partition (step)"] = fp32_gradient_partition_bytes(p, n)
    return gpu, cpu_per_rank, nvme_per_rank


def _device_terms(
    shape: ModelShape,
    strategy: Strategy,
    buckets: Buckets,
    *,
    world: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    has_gpu: bool,
) -> dict[str, int]:
    """Per-device terms beside the model states: buffers, live parameters, activations, logits, the CUDA context
    and ZenFlow's selective optimizer (host_buffers.py [ZenFlow])."""
    p = shape.params
    gpu: dict[str, int] = {"comm buckets": comm_bucket_bytes(strategy, buckets)}
    if strategy.zero_stage >= 3:
        gpu["live parameters"] = live_param_bytes(p, shape.persistent_params, shape.largest_param_numel, buckets)
        gpu["persistent small params"] = persistent_param_bytes(shape.persistent_params)
    gpu["activations"] = activation_bytes(
        seq_len,
        micro_batch,
        shape.hidden_size,
        shape.num_layers,
        checkpointing,
        cross_attention_layers=shape.cross_attention_layers,
        attention_width=shape.attention_width,
    )
    if shape.adapter_saved_bytes_per_token:  # adapters.py [LoRA-act]: every block's, or the recomputed one's
        blocks = 1 if checkpointing else shape.num_layers
        per_block = shape.adapter_saved_bytes_per_token // max(1, shape.num_layers)
        gpu["adapter activations"] = per_block * blocks * seq_len * micro_batch
    # [enc-dec] an encoder-decoder's logits are the decoder's, over its s target tokens: the same term
    gpu["logits"] = logits_bytes(seq_len, micro_batch, shape.vocab_size)
    if strategy.offload_activations == "cpu" and checkpointing:
        # host_buffers.py [act-offload] the layer inputs wait in pinned CPU RAM; the one being recomputed is back
        # on the GPU
        hidden_state = BYTES_16BIT * seq_len * micro_batch * shape.hidden_size
        gpu["activations"] -= hidden_state * (shape.num_layers - 1)
    if has_gpu:
        gpu["CUDA context"] = CUDA_CONTEXT_BYTES
    if strategy.zenflow_interval:
        gpu |= zenflow_device_terms(shape.optimized_params, world)
    return gpu


def _per_node(
    gpu: dict[str, int],
    cpu_per_rank: dict[str, int],
    nvme_per_rank: dict[str, int],
    *,
    ranks_per_node: int,
    has_gpu: bool,
) -> tuple[dict[str, int], dict[str, int]]:
    """(CPU, NVMe) terms per node: the per-rank terms summed over a node's ranks, each rank's process baseline, and
    the device memory of DeepSpeed's CPU accelerator."""
    r = ranks_per_node
    cpu = {name: value * r for name, value in cpu_per_rank.items()}
    cpu["process baseline"] = process_baseline(has_gpu) * r
    if not has_gpu:
        # DeepSpeed's CPU accelerator: "device" memory is this node's RAM.
        cpu["device memory (CPU accelerator)"] = sum(gpu.values()) * r
    return cpu, {name: value * r for name, value in nvme_per_rank.items()}


def process_baseline(has_gpu: bool) -> int:
    return PROCESS_BASELINE_BYTES_CUDA if has_gpu else PROCESS_BASELINE_BYTES_CPU


def estimate(
    shape: ModelShape,
    strategy: Strategy,
    buckets: Buckets,
    *,
    world: int,
    ranks_per_node: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    has_gpu: bool,
    pin_memory: bool = True,
    pinned_round_limit: int | None = None,
    grad_accum: int = 1,
    cuda_context_bytes: int | None = None,
    gpu_room: int | None = None,
    weights_copied: bool = True,
    merge: bool = False,
) -> MemoryEstimate:
    """Bytes per tier for one strategy. `pin_memory`: the ds_config's offload_*.pin_memory (the planner's
    default, True, is the conservative side); `pinned_round_limit`: PINNED_ROUND_LIMIT_BYTES when the ranks
    run with PINNED_ALLOC_CONF, None for torch's default rounding (both host_buffers.py); `grad_accum`: gradient
    accumulation steps (ZeRO-1/2 CPU offload pins per-param accumulation buffers when > 1); `cuda_context_bytes`:
    the probe's (Rates.cuda_context_bytes), None for CUDA_CONTEXT_BYTES; `gpu_room`, `weights_copied`, `merge`: the
    moments' (peaks.host_moments)."""
    workload = {"seq_len": seq_len, "micro_batch": micro_batch, "checkpointing": checkpointing, "has_gpu": has_gpu}
    gpu, cpu_per_rank, nvme_per_rank = _states_by_tier(shape, strategy, buckets, world)
    gpu |= _device_terms(shape, strategy, buckets, world=world, **workload)
    if has_gpu and cuda_context_bytes is not None:
        gpu["CUDA context"] = cuda_context_bytes  # measured on this host (measure/probe.py)
    cpu_per_rank |= offload_host_terms(
        shape,
        strategy,
        buckets,
        world=world,
        pin_memory=pin_memory,
        round_limit=pinned_round_limit,
        grad_accum=grad_accum,
        **workload,
    )
    cpu, nvme = _per_node(gpu, cpu_per_rank, nvme_per_rank, ranks_per_node=ranks_per_node, has_gpu=has_gpu)
    cpu_moments = peaks.host_moments(
        shape,
        strategy,
        cpu,
        gpu,
        world=world,
        ranks_per_node=ranks_per_node,
        has_gpu=has_gpu,
        baseline=process_baseline(has_gpu),
        gpu_room=gpu_room,
        weights_copied=weights_copied,
        merge=merge,
    )
    gpu_moments = peaks.device_moments(sum(gpu.values()))
    return MemoryEstimate(gpu, cpu, nvme, cpu_moments, gpu_moments)
