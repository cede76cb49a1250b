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
  [DS-swap] DeepSpeed swap_tensor/: optimizer swapper pins buffer_count buffers of the largest
            sub-group (fp32); parameter swapper pins buffer_count x buffer_size elements (fp16). Both come
            from the aio handle's `new_cpu_locked_tensor` (posix_memalign + mlock): exact sizes.
  [DS-lazy] With the optimizer on NVMe, the first step's moments are not in the swap buffers: DeepSpeedCPUAdam
            creates m and v lazily (ops/adam/cpu_adam.py `step`: `state['exp_avg'] = torch.zeros_like(p.data)`, the
            same for exp_avg_sq), unpinned, and the swapper copies them into its buffers to write them out
            (`_swap_out_optimizer_state`: `get_unpinned_state_tensors`). DeepSpeed's serial swapper then frees them
            (partitioned_optimizer_swapper.py `swap_out_optimizer_state` -> `release_swap_buffers` ->
            `swap_info.release_memory()`): one sub-group's m and v at a time. The pipelined swapper never does
            (pipelined_optimizer_swapper.py `swap_out_optimizer_state` releases nothing); each sub-group's pair is
            dropped only when the next step's swap-in points its state at a swap buffer (`set_swap_buffers`), so at
            the first step's end every sub-group's m and v are in RAM: 2 x the state size x the rank's partition.
            Measured on `make bench`'s 100 M-parameter model, one rank on the CPU accelerator: with the serial
            swapper and one 100 M sub-group the peak RSS is 0.72 GiB above the steady one (8 B x 100 M = 0.75 GiB);
            pipelined (the bench row before this term), 3.52 GiB: 1.45x the prediction without it, 1.11x with it.
  [DS-pin]  DeepSpeed 0.19.8 with CPU offload pins whole flat buffers through `get_accelerator().pin_memory`
            (CUDA: `tensor.pin_memory()`, i.e. torch's caching host allocator; DS_PIN_MEMORY_BACKEND=native
            would use mlock instead, not the default):
            stage_1_and_2.py __init__: `weights_partition = get_accelerator().pin_memory(
            weights_partition)` (fp32 partition), `temp_pinned = get_accelerator().pin_memory(temp_buffer_bit16)`
            (`param_buffer_of_bit16_for_cpu_offload_groups`, a 16-bit copy of the partition),
            `temp_grad_buffer_for_cpu_offload = get_accelerator().pin_memory(...)` (16-bit, largest param),
            `initialize_optimizer_states`: `single_partition_of_fp32_groups[i].grad = get_accelerator().pin_memory(
            single_grad_partition)`; with gradient accumulation `buffer_to_accumulate_to_in_cpu` pins one
            16-bit buffer of the whole param per param in the partition (`accumulated_grads_in_cpu`).
            stage3.py: `grad_partitions_flat_buffer = get_accelerator().pin_memory(...)` (16-bit, all grad
            partitions, on CPU whenever the optimizer is offloaded), `subgroup_gradient_buffer =
            get_accelerator().pin_memory(subgroup_gradient_buffer)` (fp32, one per sub-group, CPU offload),
            `_create_param_groups_fp16_flat_cpu_memory`: `get_accelerator().pin_memory(torch.empty(
            flat_buffer_size, dtype=self.dtype))` with offload_param, unconditionally (pin_memory ignored).
            Each flag is `offload_optimizer.pin_memory`; the fp32 master copy and Adam m, v are not pinned.
  [torch-host] torch ATen/core/CachingHostAllocator.h (torch 2.13) `allocate`: "Round up the allocation to
            the nearest power of two to improve reuse" - `c10::llvm::PowerOf2Ceil(size)` unless size >
            pinned_max_round_threshold() or > pinned_max_cached_size() (both unlimited by default). The CUDA
            side (aten/src/ATen/cuda/CachingHostAllocator.cpp) passes that rounded size to cudaHostAlloc, or
            with `pinned_use_cuda_host_register:True` to `allocWithCudaHostRegister(ptr, roundSize)`, which
            mallocs, pre-faults every page and cudaHostRegisters roundSize: the rounding is resident either
            way. The PYTORCH_ALLOC_CONF keys `pinned_max_round_threshold_mb` / `pinned_max_cached_size_mb`
            (in torch 2.13's libc10, not in older releases, where an unknown key is an error) turn it off
            above a size; see PINNED_ALLOC_CONF.
  [Twin-Flow] DeepSpeed ZeRO-Offload++ (blogs/deepspeed-offloadpp, PR 4636, DeepSpeed >= 0.12.4):
            offload_optimizer.ratio, ZeRO-3 only. stage3.py `_create_fp32_partitions` keeps sub-group i on the GPU
            when i < int((1 - ratio) x sub-groups), the rest on the CPU: the GPU's share holds its fp32 master, m,
            v (12 B) and fp32 gradient (4 B, `subgroup_gradient_buffer.to(device)`) on the device and is stepped by
            torch's AdamW there (`backup_optimizer`); the 16-bit gradient partition stays on the CPU whole
            (`grad_partitions_flat_buffer`). The split is by whole sub-groups, so the share is quantized.
  [DS-bf16s] DeepSpeed >= 0.19.1 (PR 8010): `bf16.bf16_master_weights_and_grads` + `bf16.bf16_optimizer_states`
            with the optimizer offloaded to the CPU keep the master weights, Adam's m and v and the optimizer's
            gradient partition in bf16 (base_optimizer.py `_configure_master_weights` -> master_weights_and_grads
            dtype; engine.py builds DeepSpeedCPUAdam with fp32_optimizer_states=False): 2 B each instead of 4, so
            6 + 2 B/param on the CPU instead of 12 + 4. Other numerics: opt-in (--optimizer-states bf16).
  [ZenFlow] DeepSpeed ZenFlow (Lan et al. 2025, arXiv 2505.12242; deepspeed/runtime/zenflow/, the ZenFlow and
            core-binding blogs): each step the top-k gradient columns (ZenFlowConfig.topk_ratio, 0.1) update on the
            device by ZenFlowSelectiveAdamW, which keeps their m and v there (fp32, 8 B per selected element) beside a
            16-bit buffer of the selected gradients; the others accumulate on the host and a separate optimizer
            process (zenflow_utils.py `start_optimizer_process`, a spawned child that imports torch again) updates
            them every update_interval steps from double-buffered m and v (exp_avg0/1, exp_avg_sq0/1: 16 B/param in
            place of CPU-Adam's 8) beside a stale copy of the parameters and two overlap gradient buffers (fp32,
            4 + 4 + 4 B/param). Measured on the CPU accelerator (16.7 M parameters, one rank): 1,715 MiB with
            ZenFlow against 910 MiB without, i.e. 0.5 GiB of process baseline and ~18 B/param more; counted:
            0.5 GiB + 20 B/param.
  [act-offload] torch.autograd.graph.save_on_cpu(pin_memory=True) (torch/autograd/graph.py): every tensor autograd
            saves in the forward is copied into a new pinned CPU tensor (`pack_to_cpu`: torch.empty(..., pin_memory)
            + copy_) and copied back in the backward (`unpack_from_cpu`: .to(device, non_blocking)). With activation
            checkpointing the saved tensors are each layer's input (2·s·b·h B), the final norm's and the head's inputs
            and the fp32 logits the loss keeps (4·s·b·V B); the layer being recomputed is on the GPU as before. Each
            is its own pinned allocation, rounded by torch's caching host allocator [torch-host]. DeepSpeed's own
            answer is activation_checkpointing.cpu_checkpointing with its checkpointing API, which HF models do not
            call; its ZeRO-Offload tutorial fits GPT-2 10B with batch 10 on one 32 GB V100 that way.
  [SuperOffload] DeepSpeed SuperOffload (offload_optimizer.super_offload, ZeRO-3, CUDA only: superoffload_stage3.py
            `_validate_superoffload_accelerator`; the SuperOffload blog, 2025, for GH200/GB200 superchips): ZeRO-3's
            CPU offload whose CPU-Adam runs in a worker process (superoffload_utils.py, `cpuadam_cores_perc` of the
            rank's cores, DeepSpeed's default 0.8, which the tool writes) that steps each bucket as soon as its
            gradients arrive, speculatively, validated after the backward. Counted: the worker's process baseline.
  [DS-live] DeepSpeed partitioned_param_coordinator.py: `fetch_sub_module` gathers the current module's
            params unconditionally, then prefetches `min(max_n_available_params - n_available_params,
            prefetch_bucket_sz)` elements (the loop overshoots by one param); `__params_to_release` keeps every
            param used again within `max_reuse_distance_in_numel` elements of the trace (those count in
            n_available_params too). Live gathered elements <= max(stage3_max_live_parameters,
            stage3_max_reuse_distance) + current module + one overshooting param.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.units import GiB

BYTES_16BIT = 2
BYTES_FP32 = 4
ZENFLOW_TOPK_RATIO = 0.1  # [ZenFlow] DeepSpeed's default topk_ratio, which the tool writes
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
# DeepSpeed's defaults (runtime/zero/config.py): the bound on the live set ([DS-live]) when a config does not
# set the keys; the planner writes its own per-plan bound (zero3_live_parameter_limit) into every ZeRO-3 config.
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
# [torch-host] The allocator setting that stops the power-of-two rounding above 64 MiB. Both keys with the
# same value: a block above it is then neither rounded nor cached, so a free-list bucket never holds blocks
# of different sizes (torch 2.13's get_free_block takes the bucket's last block without a size check:
# pytorch PR 192722, "heap overflow ... when pinned_max_round_threshold_mb is set below
# pinned_max_cached_size_mb"). Only for a torch that knows the keys; pass PINNED_ROUND_LIMIT_BYTES as
# estimate(pinned_round_limit=...) exactly when the ranks run with it.
PINNED_ROUND_LIMIT_MB = 64
PINNED_ROUND_LIMIT_BYTES = PINNED_ROUND_LIMIT_MB * 2**20
PINNED_ALLOC_CONF = (
    f"pinned_max_round_threshold_mb:{PINNED_ROUND_LIMIT_MB},pinned_max_cached_size_mb:{PINNED_ROUND_LIMIT_MB}"
)
# The torch release whose libc10 knows both keys (older ones refuse an unknown key), and the variables a
# user sets the allocator with (PYTORCH_CUDA_ALLOC_CONF: the older name, still read): a user's setting wins.
PINNED_ALLOC_CONF_MIN_TORCH = (2, 13)
ALLOC_CONF_ENVS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _release(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "2.13.0+cu128"; None when unreadable."""
    parts = (version or "").split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def pinned_alloc_conf(
    accelerator: str, environ: Mapping[str, str], torch_version: str | None, *, local_ranks: bool = True
) -> str | None:
    """The PYTORCH_ALLOC_CONF the ranks get (None: none is set) - the one decision both the estimate
    (pinned_round_limit) and the launch command (launch.LaunchSpec.alloc_conf) follow. PINNED_ALLOC_CONF
    when the ranks run CUDA (torch's host allocator rounds only there), with a torch that knows its keys
    (>= 2.13), where nobody set the allocator already (ALLOC_CONF_ENVS in `environ`: the user's setting is
    kept, and the estimate keeps torch's default rounding), and the ranks start here (`local_ranks`: with a
    hostfile DeepSpeed's runner does not export PYTORCH_* variables to the other hosts, runner.py
    EXPORT_ENVS, and their torch is unknown)."""
    if accelerator != "cuda" or not local_ranks:
        return None
    if any(name in environ for name in ALLOC_CONF_ENVS):
        return None
    release = _release(torch_version)
    if release is None or release < PINNED_ALLOC_CONF_MIN_TORCH:
        return None
    return PINNED_ALLOC_CONF


def pinned_round_limit(alloc_conf: str | None) -> int | None:
    """estimate(pinned_round_limit=...) for the ranks' PYTORCH_ALLOC_CONF: PINNED_ROUND_LIMIT_BYTES exactly
    when they run with PINNED_ALLOC_CONF, else None (torch's default rounding)."""
    return PINNED_ROUND_LIMIT_BYTES if alloc_conf == PINNED_ALLOC_CONF else None


@dataclass(frozen=True)
class Strategy:
    zero_stage: int
    offload_optimizer: str = "none"  # "none" | "cpu" | "nvme"
    offload_param: str = "none"
    # [Twin-Flow] offload_optimizer.ratio as written to the ds_config: the share of the optimizer's sub-groups on
    # the CPU (1: all of them); below 1 only with ZeRO-3 and the optimizer on the CPU
    offload_ratio: float = 1.0
    # [DS-bf16s] the precision of the offloaded optimizer's master weights, moments and gradients: "fp32" | "bf16"
    optimizer_states: str = "fp32"
    # [ZenFlow] steps between the CPU's updates (ZenFlow's update_interval); 0: no ZenFlow
    zenflow_interval: int = 0
    offload_activations: str = "none"  # [act-offload] "none" | "cpu": the checkpointed activations in pinned CPU RAM
    super_offload: bool = False  # [SuperOffload] ZeRO-3, optimizer on the CPU, CUDA: DeepSpeed's superchip offload

    @property
    def state_bytes(self) -> int:
        """Bytes per element of the optimizer's master weights, m, v and gradient partition ([DS-bf16s])."""
        return BYTES_16BIT if self.optimizer_states == "bf16" else BYTES_FP32

    @property
    def states_term(self) -> str:
        return f"{self.optimizer_states} optimizer states"

    @property
    def gradients_term(self) -> str:
        return f"{self.optimizer_states} gradient partition"

    @property
    def partial(self) -> bool:
        """Part of the optimizer stays on the GPU ([Twin-Flow])."""
        return self.offload_optimizer == "cpu" and self.offload_ratio < 1

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.partial:
            parts.append(f"opt->cpu {self.offload_ratio:.0%}")
        elif self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        if self.zenflow_interval:
            parts.append(f"ZenFlow/{self.zenflow_interval}")
        if self.super_offload:
            parts.append("SuperOffload")
        if self.offload_activations != "none":
            parts.append(f"act->{self.offload_activations}")
        label = " + ".join(parts)
        return label + " (bf16 states)" if self.optimizer_states == "bf16" else label

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    def to_json(self) -> dict:
        out: dict = {
            "zero_stage": self.zero_stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
        }
        if self.offload_optimizer != "none":
            out["offload_ratio"] = self.offload_ratio
            out["optimizer_states"] = self.optimizer_states
        if self.zenflow_interval:
            out["zenflow_interval"] = self.zenflow_interval
        if self.offload_activations != "none":
            out["offload_activations"] = self.offload_activations
        if self.super_offload:
            out["super_offload"] = True
        return out


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
    pipeline: bool = False  # offload_optimizer.pipeline_read / pipeline_write (NVMe: capacity.nvme_optimizer_sizing)
    max_live_parameters: int = DS_MAX_LIVE_PARAMETERS  # stage3_max_live_parameters
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE  # stage3_max_reuse_distance


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
    # partitioned from stage 1 on; master, m, v of 2 B each with bf16 states [DS-bf16s]
    optimizer = OPTIMIZER_BYTES_PER_PARAM * params // n * strategy.state_bytes // BYTES_FP32
    tiers: dict[str, dict[str, int]] = {"gpu": {}, "cpu": {}, "nvme": {}}
    param_tier = "gpu" if strategy.offload_param == "none" else strategy.offload_param
    optimizer_tier = "gpu" if strategy.offload_optimizer == "none" else strategy.offload_optimizer
    tiers[param_tier]["fp16 weights"] = weights
    # With the optimizer offloaded, gradients stream to where the update runs ([seeds] ZeRO-Offload).
    tiers[optimizer_tier]["fp16 gradients"] = grads if optimizer_tier == "gpu" else BYTES_16BIT * params // n
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


def offloaded_activation_numels(
    seq_len: int, micro_batch: int, hidden: int, layers: int, vocab: int, cross_attention_layers: int = 0
) -> list[int]:
    """[act-offload] the bytes of each tensor save_on_cpu moves per micro-batch: the 16-bit hidden states each
    stack saves (each block's input, the final norm's input and output: L + 2; [enc-dec] an encoder-decoder has two
    stacks, L + 4, the encoder's output read by the decoder's cross-attention among them) and the fp32 logits."""
    tokens = seq_len * micro_batch
    stacks = 2 if cross_attention_layers else 1
    return [BYTES_16BIT * tokens * hidden] * (layers + 2 * stacks) + [BYTES_FP32 * tokens * vocab]


def logits_bytes(seq_len: int, micro_batch: int, vocab: int) -> int:
    """Logits in 16-bit (2 B), upcast to fp32 for the loss (4 B) and its fp32 gradient (4 B), per token
    per vocabulary entry (transformers' ForCausalLMLoss upcasts logits to float)."""
    return seq_len * micro_batch * vocab * (BYTES_16BIT + BYTES_FP32 + BYTES_FP32)


# ------------------------------------------------------------------------------------- pinned host memory


def power_of_two_ceil(n: int) -> int:
    """c10::llvm::PowerOf2Ceil: the smallest power of two >= n (0 stays 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def pinned_bytes(nbytes: int, round_limit: int | None = None) -> int:
    """[torch-host] what torch's caching host allocator takes for one pinned allocation of `nbytes`: the next
    power of two, unless above `round_limit` (PYTORCH_ALLOC_CONF pinned_max_round_threshold_mb; None: torch's
    default, no limit)."""
    if round_limit is not None and nbytes > round_limit:
        return nbytes
    return power_of_two_ceil(nbytes)


def stage3_subgroup_numels(partition: int, sub_group_size: int, subgroup_numel: int) -> list[int]:
    """ZeRO-3 sub-groups of one rank's partition (stage3.py `_create_fp16_sub_groups`): params are added until
    a group reaches sub_group_size, so each full group holds between sub_group_size and `subgroup_numel`
    (optimizer_subgroup_numel) elements. Counted as full groups of the larger size, one per sub_group_size
    of the partition (an upper bound on both the count and the sizes), the last one the remainder."""
    if partition <= 0:
        return []
    if sub_group_size >= partition:
        return [partition]
    full = (partition - 1) // sub_group_size
    return [subgroup_numel] * full + [max(1, partition - full * subgroup_numel)]


def gpu_subgroup_count(groups: int, ratio: float) -> int:
    """[Twin-Flow] how many of a rank's sub-groups stage3.py keeps on the GPU: those with i < int((1 - ratio) x
    sub-groups)."""
    return int((1 - ratio) * groups)


def split_subgroups(partition: int, sub_group_size: int, subgroup_numel: int, ratio: float) -> tuple[list, list]:
    """(the sub-groups on the GPU, those on the CPU) of stage3_subgroup_numels' bound ([Twin-Flow])."""
    groups = stage3_subgroup_numels(partition, sub_group_size, subgroup_numel)
    on_gpu = gpu_subgroup_count(len(groups), ratio)
    return groups[:on_gpu], groups[on_gpu:]


def stage3_subgroups(shape: ModelShape, world: int, sub_group_size: int) -> list[int]:
    """One rank's ZeRO-3 sub-groups as stage3.py `_create_fp16_sub_groups` forms them: each tensor's partition
    (ceil(numel / N), `partition_numel()`) added in order until a group reaches sub_group_size; the whole
    partition is one group when sub_group_size is not below it. Without the tensors' sizes, the bound of
    stage3_subgroup_numels."""
    if not shape.param_numels:
        partition = shape.params // world
        subgroup = optimizer_subgroup_numel(shape.params, world, sub_group_size, shape.largest_param_numel)
        return stage3_subgroup_numels(partition, sub_group_size, subgroup)
    partitions = [-(-numel // world) for numel in shape.param_numels]
    if sub_group_size >= sum(partitions):
        return [sum(partitions)]
    groups, size = [], 0
    for numel in partitions:
        size += numel
        if size >= sub_group_size:
            groups.append(size)
            size = 0
    return groups + ([size] if size else [])


def optimizer_gpu_share(shape: ModelShape, strategy: Strategy, buckets: Buckets, world: int) -> float:
    """The share of the optimizer's elements a partial offload keeps on the GPU ([Twin-Flow]); 0 otherwise."""
    if not strategy.partial or strategy.zero_stage < 3:
        return 0.0
    groups = stage3_subgroups(shape, world, buckets.sub_group_size)
    on_gpu = gpu_subgroup_count(len(groups), strategy.offload_ratio)
    return sum(groups[:on_gpu]) / sum(groups)


def ratio_keeping(on_gpu: int, groups: int) -> float:
    """The offload_optimizer.ratio that keeps exactly the first `on_gpu` of `groups` sub-groups on the GPU
    (stage3.py's int((1 - ratio) x groups) == on_gpu): the share on the CPU, rounded to 6 digits and nudged down
    where floating point would land one sub-group short."""
    ratio = round(1 - on_gpu / groups, 6)
    while int((1 - ratio) * groups) < on_gpu:
        ratio = round(ratio - 1e-6, 6)
    return ratio


def pinned_host_terms(
    shape: ModelShape,
    strategy: Strategy,
    buckets: Buckets,
    *,
    world: int,
    cuda: bool,
    pin_memory: bool,
    round_limit: int | None,
    grad_accum: int,
) -> dict[str, int]:
    """Per-rank host buffers of DeepSpeed's CPU offload that the state terms leave out, and the power-of-two
    rounding of every buffer torch's caching host allocator pins ([DS-pin], [torch-host]).

    Rounding applies only on CUDA (`cuda`): on DeepSpeed's CPU accelerator `pin_memory()` is a no-op and the
    sizes are exact. The offload buffers are pinned only with `pin_memory` (offload_*.pin_memory); ZeRO-3's
    flat 16-bit parameter buffer is pinned whatever pin_memory says."""
    p, n = shape.params, world
    partition = p // n
    terms: dict[str, int] = {}
    offload_pinned: list[int] = []  # byte sizes of the allocations pinned when pin_memory is on
    always_pinned: list[int] = []  # pinned on every CUDA host
    if strategy.offload_optimizer == "cpu" and strategy.zero_stage < 3:
        # stage_1_and_2.py: a 16-bit copy of the partition to upload the updated weights from, and a 16-bit
        # buffer of the largest param for the gradients on their way down; both exist unpinned too.
        terms["16-bit staging partition"] = BYTES_16BIT * partition
        terms["gradient staging buffer (largest param)"] = BYTES_16BIT * shape.largest_param_numel
        offload_pinned += [
            strategy.state_bytes * partition,  # the master partition (inside the optimizer states term)
            strategy.state_bytes * partition,  # the optimizer's gradient partition
            BYTES_16BIT * partition,
            BYTES_16BIT * shape.largest_param_numel,
        ]
        if grad_accum > 1:
            # `accumulated_grads_in_cpu`: one 16-bit buffer of the whole param per param of this partition,
            # each its own allocation; the partition's two boundary params are counted whole.
            accumulation = BYTES_16BIT * (partition + 2 * shape.largest_param_numel)
            if cuda and pin_memory:
                accumulation += sum(pinned_bytes(2 * k, round_limit) - 2 * k for k in shape.param_numels) // n
            terms["gradient accumulation buffers"] = accumulation
    if strategy.zero_stage >= 3 and strategy.offload_optimizer != "none":
        # stage3.py `grad_partitions_flat_buffer`: the 16-bit gradient partitions, on the CPU when the
        # optimizer is offloaded (gradient_accumulation_dtype = the model's 16-bit dtype by default).
        terms["16-bit gradient partition"] = BYTES_16BIT * partition
        offload_pinned.append(BYTES_16BIT * partition)
        if strategy.offload_optimizer == "cpu":
            subgroup = optimizer_subgroup_numel(p, n, buckets.sub_group_size, shape.largest_param_numel)
            # one pinned gradient buffer per sub-group on the CPU: the gradient partition term
            _, groups = split_subgroups(partition, buckets.sub_group_size, subgroup, strategy.offload_ratio)
            offload_pinned += [strategy.state_bytes * k for k in groups]
    if strategy.zero_stage >= 3 and strategy.offload_param != "none":
        # `_create_param_groups_fp16_flat_cpu_memory`: "fp16 weights" (CPU) or "params kept in CPU"
        flat = p // n if strategy.offload_param == "cpu" else min(p // n, buckets.max_in_cpu)
        always_pinned.append(BYTES_16BIT * flat)
    pinned = ((offload_pinned if pin_memory else []) + always_pinned) if cuda else []
    overhead = sum(pinned_bytes(b, round_limit) - b for b in pinned)
    if overhead:
        terms["pinned rounding (torch host allocator)"] = overhead
    return terms


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


# ------------------------------------------------------------------------------------- ZenFlow


def zenflow_device_terms(params: int, world: int) -> dict[str, int]:
    """[ZenFlow] per device: the selected columns' fp32 m and v and their 16-bit gradient buffer."""
    selected = int(ZENFLOW_TOPK_RATIO * params // world)
    return {"ZenFlow selective optimizer states": selected * (2 * BYTES_FP32 + BYTES_16BIT)}


def zenflow_host_terms(params: int, world: int) -> dict[str, int]:
    """[ZenFlow] per rank on the host: the optimizer process's own baseline, its double-buffered m and v beyond
    CPU-Adam's, the stale parameter copy and the two overlap gradient buffers."""
    partition = params // world
    return {
        "ZenFlow optimizer process": PROCESS_BASELINE_BYTES_CPU,
        "ZenFlow double-buffered moments": 2 * BYTES_FP32 * partition,
        "ZenFlow stale parameters and overlap gradients": 3 * BYTES_FP32 * partition,
    }


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
    param_numels: tuple[int, ...] = ()  # every tensor's numel (per-param pinned buffers); () when unknown
    cross_attention_layers: int = 0  # [enc-dec] decoder blocks with a cross-attention sublayer; 0: one stack
    attention_width: int = 0  # [Korth] heads x head_dim where it differs from hidden_size; 0: hidden_size


def host_buffer_bytes(shape: ModelShape, strategy: Strategy, buckets: Buckets, *, world: int) -> dict[str, int]:
    """Per-rank host buffers the offload machinery allocates besides the states: ZeRO-3's sub-group gradient
    buffer (CPU) or the optimizer's pinned swap buffers and the first step's moments on their way to them (NVMe,
    [DS-lazy]), and the parameter swap buffers with the parameters kept in CPU (`max_in_cpu`) when parameters swap
    to NVMe."""
    p = shape.params
    terms: dict[str, int] = {}
    if strategy.zero_stage >= 3 and strategy.offload_optimizer != "none":
        subgroup = optimizer_subgroup_numel(p, world, buckets.sub_group_size, shape.largest_param_numel)
        if strategy.offload_optimizer == "nvme":
            terms["optimizer swap buffers (pinned)"] = optimizer_swap_buffer_bytes(
                subgroup, buckets.optimizer_buffer_count
            )
            # [DS-lazy] the first step's moments, unpinned: the whole partition's when pipelined, else a sub-group's
            held = -(-p // world) if buckets.pipeline else subgroup
            terms["first step's new Adam moments (unpinned)"] = 2 * strategy.state_bytes * held
        else:
            terms["sub-group gradient buffer"] = subgroup * strategy.state_bytes
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
    pin_memory: bool = True,
    pinned_round_limit: int | None = None,
    grad_accum: int = 1,
) -> MemoryEstimate:
    """Bytes per tier for one strategy. `pin_memory`: the ds_config's offload_*.pin_memory (the planner's
    default, True, is the conservative side); `pinned_round_limit`: PINNED_ROUND_LIMIT_BYTES when the ranks
    run with PINNED_ALLOC_CONF, None for torch's default rounding; `grad_accum`: gradient accumulation steps
    (ZeRO-1/2 CPU offload pins per-param accumulation buffers when > 1)."""
    p, n, r = shape.params, world, ranks_per_node
    states = model_states(p, strategy, n)
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

    gpu["comm buckets"] = comm_bucket_bytes(strategy, buckets)
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
    # [enc-dec] an encoder-decoder's logits are the decoder's, over its s target tokens: the same term
    gpu["logits"] = logits_bytes(seq_len, micro_batch, shape.vocab_size)
    if strategy.offload_activations == "cpu" and checkpointing:
        # [act-offload] the layer inputs wait in pinned CPU RAM; the one being recomputed is back on the GPU
        hidden_state = BYTES_16BIT * seq_len * micro_batch * shape.hidden_size
        gpu["activations"] -= hidden_state * (shape.num_layers - 1)
        saved = offloaded_activation_numels(
            seq_len, micro_batch, shape.hidden_size, shape.num_layers, shape.vocab_size, shape.cross_attention_layers
        )
        cpu_per_rank["offloaded activations (pinned)"] = sum(
            pinned_bytes(b, pinned_round_limit) if has_gpu else b for b in saved
        )
    if has_gpu:
        gpu["CUDA context"] = CUDA_CONTEXT_BYTES

    cpu_per_rank |= host_buffer_bytes(shape, strategy, buckets, world=n)
    cpu_per_rank |= pinned_host_terms(
        shape,
        strategy,
        buckets,
        world=n,
        cuda=has_gpu,
        pin_memory=pin_memory,
        round_limit=pinned_round_limit,
        grad_accum=grad_accum,
    )

    if strategy.super_offload:
        cpu_per_rank["SuperOffload CPU-Adam process"] = PROCESS_BASELINE_BYTES_CPU
    if strategy.zenflow_interval:
        gpu |= zenflow_device_terms(p, n)
        cpu_per_rank |= zenflow_host_terms(p, n)
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
