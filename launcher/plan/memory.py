"""Memory model: bytes per tier (per GPU, CPU RAM per node, NVMe per node) for one strategy.

One function per term, each citing its source. Notation: P = parameters, N = data-parallel world size
(all ranks), R = ranks per node, s = sequence length, b = micro-batch, h = hidden size, L = layers,
V = vocabulary. bf16 and fp16 are both 2 bytes.

Sources:
  [seeds]   ../shared/seeds: mixed-precision Adam holds 16 B/param = fp16 weight 2 + fp16 grad 2 +
            fp32 master 4 + Adam m 4 + Adam v 4; ZeRO-Offload keeps 2 B/param on the GPU.
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
            stored by SDPA/FlashAttention (Dao et al. 2022), which transformers uses by default.
  [DS-swap] DeepSpeed swap_tensor/: optimizer swapper pins buffer_count buffers of the largest
            sub-group (fp32); parameter swapper pins buffer_count x buffer_size elements (fp16).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.units import GiB

BYTES_16BIT = 2
BYTES_FP32 = 4
OPTIMIZER_BYTES_PER_PARAM = 12  # [seeds] fp32 master 4 + m 4 + v 4
OVERLAP_COMM_FACTOR = 4.5  # [DS-docs]
CUDA_CONTEXT_BYTES = 1 * GiB  # CUDA context + cuBLAS/NCCL workspaces, measured ~0.5-1 GiB on A100/H100
# Resident set of one rank before model states: python + torch + deepspeed + transformers + data. Measured
# here on the CPU accelerator: 0.43-0.57 GiB peak RSS per rank for 0.1-4 M parameter models (make bench).
# With CUDA the runtime, cuBLAS/cuDNN kernels and the host side of the context add ~1.5 GiB per process.
PROCESS_BASELINE_BYTES_CPU = GiB // 2
PROCESS_BASELINE_BYTES_CUDA = 2 * GiB
GPU_USABLE_FRACTION = 0.90  # allocator fragmentation headroom on the GPU
CPU_USABLE_FRACTION = 0.85  # leave the OS, page cache and data loader room
NVME_USABLE_FRACTION = 0.95


@dataclass(frozen=True)
class Strategy:
    zero_stage: int
    offload_optimizer: str = "none"  # "none" | "cpu" | "nvme"
    offload_param: str = "none"

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        return " + ".join(parts)

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    def to_json(self) -> dict:
        return {
            "zero_stage": self.zero_stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
        }


@dataclass(frozen=True)
class Buckets:
    """The ds_config numbers the memory model depends on (elements, not bytes)."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    sub_group_size: int
    optimizer_buffer_count: int
    param_buffer_count: int
    param_buffer_size: int
    max_in_cpu: int
    overlap_comm: bool = True


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per tier, term by term, so a table can show where the memory goes."""

    gpu_terms: dict[str, int] = field(default_factory=dict)  # per device (GPU, or rank on CPU accelerator)
    cpu_terms: dict[str, int] = field(default_factory=dict)  # per node
    nvme_terms: dict[str, int] = field(default_factory=dict)  # per node

    @property
    def gpu_bytes_per_device(self) -> int:
        return sum(self.gpu_terms.values())

    @property
    def cpu_bytes(self) -> int:
        return sum(self.cpu_terms.values())

    @property
    def nvme_bytes(self) -> int:
        return sum(self.nvme_terms.values())

    def to_json(self) -> dict:
        return {
            "gpu_bytes_per_device": self.gpu_bytes_per_device,
            "cpu_bytes": self.cpu_bytes,
            "nvme_bytes": self.nvme_bytes,
            "gpu_terms": dict(self.gpu_terms),
            "cpu_terms": dict(self.cpu_terms),
            "nvme_terms": dict(self.nvme_terms),
        }


# ------------------------------------------------------------------------------------- model states


def model_states(params: int, strategy: Strategy, world: int) -> dict[str, dict[str, int]]:
    """The seeds' 16 B/param budget placed on tiers and partitioned by ZeRO stage ([seeds], [ZeRO]).

    Returns {"gpu": {...}, "cpu": {...}, "nvme": {...}} in bytes *per rank*. This is the textbook split
    (7B ZeRO-Offload: 14 GB GPU + 98 GB CPU); `estimate()` adds what DeepSpeed really allocates on top.
    """
    stage, n = strategy.zero_stage, world
    weights = BYTES_16BIT * params // (n if stage >= 3 else 1)
    grads = BYTES_16BIT * params // (n if stage >= 2 else 1)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * params // n  # partitioned from stage 1 on
    tiers: dict[str, dict[str, int]] = {"gpu": {}, "cpu": {}, "nvme": {}}
    param_tier = "gpu" if strategy.offload_param == "none" else strategy.offload_param
    optimizer_tier = "gpu" if strategy.offload_optimizer == "none" else strategy.offload_optimizer
    tiers[param_tier]["fp16 weights"] = weights
    # With the optimizer offloaded, gradients stream to where the update runs ([seeds] ZeRO-Offload).
    tiers[optimizer_tier]["fp16 gradients"] = grads if optimizer_tier == "gpu" else BYTES_16BIT * params // n
    tiers[optimizer_tier]["fp32 optimizer states"] = optimizer
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


def gathered_param_bytes(layer_params: int, largest_param_numel: int) -> int:
    """ZeRO-3 gathers a layer's full fp16 weights just before use ([ZeRO] §5.3): the widest block plus
    the largest single tensor (embedding / lm_head / fused experts), gathered whole."""
    return BYTES_16BIT * (layer_params + largest_param_numel)


def persistent_param_bytes(small_params: int) -> int:
    """ZeRO-3 keeps tensors below stage3_param_persistence_threshold whole on every rank."""
    return BYTES_16BIT * small_params


# ------------------------------------------------------------------------------------- activations


def activation_bytes(seq_len: int, micro_batch: int, hidden: int, layers: int, checkpointing: bool) -> int:
    """[Korth] 34·s·b·h bytes per layer without the attention-score term (SDPA). With activation
    checkpointing only each layer's 2-byte input is kept, plus one layer's activations while it is
    recomputed in backward."""
    per_layer = 34 * seq_len * micro_batch * hidden
    if not checkpointing:
        return per_layer * layers
    return BYTES_16BIT * seq_len * micro_batch * hidden * layers + per_layer


def logits_bytes(seq_len: int, micro_batch: int, vocab: int) -> int:
    """Logits in 16-bit (2 B), upcast to fp32 for the loss (4 B) and its fp32 gradient (4 B), per token
    per vocabulary entry (transformers' ForCausalLMLoss upcasts logits to float)."""
    return seq_len * micro_batch * vocab * (BYTES_16BIT + BYTES_FP32 + BYTES_FP32)


# ------------------------------------------------------------------------------------- swap buffers


def optimizer_subgroup_numel(params: int, world: int, sub_group_size: int, largest_param_numel: int) -> int:
    """Largest ZeRO-3 optimizer sub-group per rank: params are added until the group reaches
    sub_group_size (stage3.py `_create_fp16_sub_groups`), so it can overshoot by one partition."""
    return min(params // world, sub_group_size + -(-largest_param_numel // world))


def optimizer_swap_buffer_bytes(subgroup_numel: int, buffer_count: int) -> int:
    """[DS-swap] buffer_count pinned fp32 buffers of the largest sub-group, plus its fp32 gradient
    buffer (stage3.py allocates one of the largest sub-group)."""
    return (buffer_count + 1) * subgroup_numel * BYTES_FP32


def param_swap_buffer_bytes(buffer_count: int, buffer_size: int) -> int:
    """[DS-swap] / FIELD-NOTES: pinned RAM for parameter swap ~ buffer_count x buffer_size x 2 B."""
    return buffer_count * buffer_size * BYTES_16BIT


# ------------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class ModelShape:
    """The model numbers the estimate needs (a ModelProfile satisfies this, as do tests)."""

    params: int
    largest_param_numel: int
    layer_params: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    persistent_params: int  # elements in tensors below the persistence threshold


def host_buffer_bytes(shape: ModelShape, strategy: Strategy, buckets: Buckets, *, world: int) -> dict[str, int]:
    """Per-rank host buffers the offload machinery allocates besides the states: ZeRO-3's sub-group gradient
    buffer (CPU) or the optimizer's pinned swap buffers (NVMe), and the parameter swap buffers with the
    parameters kept in CPU (`max_in_cpu`) when parameters swap to NVMe."""
    p = shape.params
    terms: dict[str, int] = {}
    if strategy.zero_stage >= 3 and strategy.offload_optimizer != "none":
        subgroup = optimizer_subgroup_numel(p, world, buckets.sub_group_size, shape.largest_param_numel)
        if strategy.offload_optimizer == "nvme":
            terms["optimizer swap buffers (pinned)"] = optimizer_swap_buffer_bytes(
                subgroup, buckets.optimizer_buffer_count
            )
        else:
            terms["sub-group gradient buffer"] = subgroup * BYTES_FP32
    if strategy.offload_param == "nvme":
        terms["param swap buffers (pinned)"] = param_swap_buffer_bytes(
            buckets.param_buffer_count, buckets.param_buffer_size
        )
        terms["params kept in CPU (max_in_cpu)"] = min(buckets.max_in_cpu, p // world) * BYTES_16BIT
    return terms


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
) -> MemoryEstimate:
    p, n, r = shape.params, world, ranks_per_node
    states = model_states(p, strategy, n)
    gpu: dict[str, int] = dict(states["gpu"])
    cpu_per_rank: dict[str, int] = dict(states["cpu"])
    nvme_per_rank: dict[str, int] = dict(states["nvme"])

    # The optimizer's gradient partition is fp32 where the optimizer lives off the GPU [DS-fp32g].
    if strategy.offload_optimizer != "none":
        tier = cpu_per_rank if strategy.offload_optimizer == "cpu" else nvme_per_rank
        tier.pop("fp16 gradients")
        tier["fp32 gradient partition"] = fp32_gradient_partition_bytes(p, n)
    else:
        # Built from the 16-bit gradients at step time while they still exist (stage_1_and_2.py step()).
        gpu["fp32 gradient partition (step)"] = fp32_gradient_partition_bytes(p, n)

    gpu["comm buckets"] = comm_bucket_bytes(strategy, buckets)
    if strategy.zero_stage >= 3:
        gpu["gathered layer"] = gathered_param_bytes(shape.layer_params, shape.largest_param_numel)
        gpu["persistent small params"] = persistent_param_bytes(shape.persistent_params)
    gpu["activations"] = activation_bytes(seq_len, micro_batch, shape.hidden_size, shape.num_layers, checkpointing)
    gpu["logits"] = logits_bytes(seq_len, micro_batch, shape.vocab_size)
    if has_gpu:
        gpu["CUDA context"] = CUDA_CONTEXT_BYTES

    cpu_per_rank |= host_buffer_bytes(shape, strategy, buckets, world=n)

    cpu = {name: value * r for name, value in cpu_per_rank.items()}
    baseline = PROCESS_BASELINE_BYTES_CUDA if has_gpu else PROCESS_BASELINE_BYTES_CPU
    cpu["process baseline"] = baseline * r
    if not has_gpu:
        # DeepSpeed's CPU accelerator: "device" memory is this node's RAM.
        cpu["device memory (CPU accelerator)"] = sum(gpu.values()) * r
    if strategy.zero_stage < 3:
        # Without ZeRO-3's partitioned loading (zero.Init) every rank first materialises the whole 16-bit
        # model in CPU RAM in from_pretrained; it moves to the device before the optimizer states exist,
        # so the peak is max(load, steady state). Only the excess over the steady state is added.
        load = (BYTES_16BIT * p + baseline) * r
        excess = load - sum(cpu.values())
        if excess > 0:
            cpu["model load peak (transient)"] = excess
    nvme = {name: value * r for name, value in nvme_per_rank.items()}
    return MemoryEstimate(gpu_terms=gpu, cpu_terms=cpu, nvme_terms=nvme)
