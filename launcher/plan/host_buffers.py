"""Host RAM the offload machinery adds beside the states: pinned staging and rounding, swap buffers, ZenFlow's process.

Also the activations an offload moves to pinned CPU RAM ([act-offload]). All per rank. N = data-parallel world size
(all ranks), L = layers; bf16 and fp16 are both 2 bytes.

Sources:
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
  [DS-init-pin] With offload_param on the CPU, zero.Init pins each parameter's partition as its own allocation
            (partition_parameters.py `_partition_param`: `torch.empty(partition_size, ..., device=cpu)`, then
            `get_accelerator().pin_memory(...)` when offload_param.pin_memory); stage3.py then copies every partition
            into the flat 16-bit buffer (`_create_param_groups_fp16_flat_cpu_memory`, `_move_to_flat_buffer`) and
            drops the per-parameter tensors. torch's caching host allocator keeps a dropped block cached for reuse
            (CachingHostAllocator.h `free` -> the free list of its power-of-two size; returned to the system only by
            `torch._C._host_emptyCache()`, which DeepSpeed never calls), and no later allocation has those sizes: the
            blocks stay resident for the whole run beside the flat buffer.
  [act-offload] torch.autograd.graph.save_on_cpu(pin_memory=True) (torch/autograd/graph.py): every tensor autograd
            saves in the forward is copied into a new pinned CPU tensor (`pack_to_cpu`: torch.empty(..., pin_memory)
            + copy_) and copied back in the backward (`unpack_from_cpu`: .to(device, non_blocking)). With activation
            checkpointing the saved tensors are each layer's input (2·s·b·h B), the final norm's and the head's inputs
            and the fp32 logits the loss keeps (4·s·b·V B); the layer being recomputed is on the GPU as before. Each
            is its own pinned allocation, rounded by torch's caching host allocator [torch-host]. DeepSpeed's own
            answer is activation_checkpointing.cpu_checkpointing with its checkpointing API, which HF models do not
            call; its ZeRO-Offload tutorial fits GPT-2 10B with batch 10 on one 32 GB V100 that way.
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
  [SuperOffload] DeepSpeed SuperOffload (offload_optimizer.super_offload, ZeRO-3, CUDA only: superoffload_stage3.py
            `_validate_superoffload_accelerator`; the SuperOffload blog, 2025, for GH200/GB200 superchips): ZeRO-3's
            CPU offload whose CPU-Adam runs in a worker process (superoffload_utils.py, `cpuadam_cores_perc` of the
            rank's cores, DeepSpeed's default 0.8, which the tool writes) that steps each bucket as soon as its
            gradients arrive, speculatively, validated after the backward. Counted: the worker's process baseline.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import BYTES_16BIT, BYTES_FP32, Buckets, Strategy
from launcher.plan.subgroups import optimizer_subgroup_numel, split_subgroups
from launcher.units import GiB

FIRST_STEP_MOMENTS = "first step's new Adam moments (unpinned)"  # [DS-lazy]: from the first step to the next
ZENFLOW_TOPK_RATIO = 0.1  # [ZenFlow] DeepSpeed's default topk_ratio, which the tool writes
# Resident set of one rank before model states: python + torch + deepspeed + transformers + data. Measured
# here on the CPU accelerator: 0.43-0.57 GiB peak RSS per rank for 0.1-4 M parameter models (make bench).
# With CUDA the runtime, cuBLAS/cuDNN kernels and the host side of the context add ~1.5 GiB per process.
PROCESS_BASELINE_BYTES_CPU = GiB // 2
PROCESS_BASELINE_BYTES_CUDA = 2 * GiB
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


def strategy_alloc_conf(alloc_conf: str | None, strategy: Strategy) -> str | None:
    """The ranks' PYTORCH_ALLOC_CONF under `strategy`, from the plan's (pinned_alloc_conf): none where the
    activations go to the CPU. save_on_cpu(pin_memory=True) [act-offload] pins new tensors every micro-batch (a
    layer's input is 2·s·b·h B: 256 MiB at 4096 tokens × 8 × 4096; the logits 4·s·b·V B), and PINNED_ALLOC_CONF
    leaves blocks above 64 MiB uncached (CachingHostAllocator.h `maybe_cache_block`: size > pinned_max_cached_size
    -> destroy_block, i.e. cudaFreeHost), so each would be pinned again every micro-batch; torch's default rounds
    them up and reuses them, which the estimate then counts."""
    return None if strategy.offload_activations != "none" else alloc_conf


def pinned_round_limit(alloc_conf: str | None) -> int | None:
    """estimate(pinned_round_limit=...) for the ranks' PYTORCH_ALLOC_CONF: PINNED_ROUND_LIMIT_BYTES exactly
    when they run with PINNED_ALLOC_CONF, else None (torch's default rounding)."""
    return PINNED_ROUND_LIMIT_BYTES if alloc_conf == PINNED_ALLOC_CONF else None


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
    p, n, largest = shape.optimized_params, world, shape.largest_optimized_numel  # memory.py [DS-frozen]
    partition = p // n
    terms: dict[str, int] = {}
    offload_pinned: list[int] = []  # byte sizes of the allocations pinned when pin_memory is on
    always_pinned: list[int] = []  # pinned on every CUDA host
    if strategy.offload_optimizer == "cpu" and strategy.zero_stage < 3:
        # stage_1_and_2.py: a 16-bit copy of the partition to upload the updated weights from, and a 16-bit
        # buffer of the largest param for the gradients on their way down; both exist unpinned too.
        terms["16-bit staging partition"] = BYTES_16BIT * partition
        terms["gradient staging buffer (largest param)"] = BYTES_16BIT * largest
        offload_pinned += [
            strategy.state_bytes * partition,  # the master partition (inside the optimizer states term)
            strategy.state_bytes * partition,  # the optimizer's gradient partition
            BYTES_16BIT * partition,
            BYTES_16BIT * largest,
        ]
        if grad_accum > 1:
            # `accumulated_grads_in_cpu`: one 16-bit buffer of the whole param per param of this partition,
            # each its own allocation; the partition's two boundary params are counted whole.
            accumulation = BYTES_16BIT * (partition + 2 * largest)
            if cuda and pin_memory:
                accumulation += sum(pinned_bytes(2 * k, round_limit) - 2 * k for k in shape.optimized_numels) // n
            terms["gradient accumulation buffers"] = accumulation
    if strategy.zero_stage >= 3 and strategy.offload_optimizer != "none":
        # stage3.py `grad_partitions_flat_buffer`: the 16-bit gradient partitions, on the CPU when the
        # optimizer is offloaded (gradient_accumulation_dtype = the model's 16-bit dtype by default).
        terms["16-bit gradient partition"] = BYTES_16BIT * partition
        offload_pinned.append(BYTES_16BIT * partition)
        if strategy.offload_optimizer == "cpu":
            subgroup = optimizer_subgroup_numel(p, n, buckets.sub_group_size, largest)
            # one pinned gradient buffer per sub-group on the CPU: the gradient partition term
            _, groups = split_subgroups(partition, buckets.sub_group_size, subgroup, strategy.offload_ratio)
            offload_pinned += [strategy.state_bytes * k for k in groups]
    if strategy.zero_stage >= 3 and strategy.offload_param != "none":
        # `_create_param_groups_fp16_flat_cpu_memory`: "fp16 weights" (CPU) or "params kept in CPU"
        weights = shape.params // n  # every parameter's partition, frozen or not (memory.py [DS-frozen])
        flat = weights if strategy.offload_param == "cpu" else min(weights, buckets.max_in_cpu)
        always_pinned.append(BYTES_16BIT * flat)
    pinned = ((offload_pinned if pin_memory else []) + always_pinned) if cuda else []
    overhead = sum(pinned_bytes(b, round_limit) - b for b in pinned)
    if overhead:
        terms["pinned rounding (torch host allocator)"] = overhead
    return terms


def init_partition_cache_bytes(
    shape: ModelShape, persistence_threshold: int, *, world: int, round_limit: int | None
) -> int:
    """[DS-init-pin] the pinned blocks zero.Init's per-parameter partitions leave in torch's host allocator cache: one
    per partitioned tensor (above the persistence threshold), b·ceil(n/N) each, rounded; with `round_limit` set
    (PINNED_ALLOC_CONF) a block above it is neither rounded nor cached, so it is returned when it is dropped."""
    blocks = (
        pinned_bytes(BYTES_16BIT * -(-k // world), round_limit) for k in shape.param_numels if k > persistence_threshold
    )
    return sum(b for b in blocks if round_limit is None or b <= round_limit)


# ------------------------------------------------------------------------------------- swap buffers


def optimizer_swap_buffer_bytes(subgroup_numel: int, buffer_count: int) -> int:
    """[DS-swap] buffer_count pinned fp32 buffers of the largest sub-group, plus its fp32 gradient
    buffer (stage3.py allocates one of the largest sub-group)."""
    return (buffer_count + 1) * subgroup_numel * BYTES_FP32


def param_swap_buffer_bytes(buffer_count: int, buffer_size: int) -> int:
    """[DS-swap] / FIELD-NOTES: pinned RAM for parameter swap ~ buffer_count x buffer_size x 2 B."""
    return buffer_count * buffer_size * BYTES_16BIT


def host_buffer_bytes(shape: ModelShape, strategy: Strategy, buckets: Buckets, *, world: int) -> dict[str, int]:
    """Per-rank host buffers the offload machinery allocates besides the states: ZeRO-3's sub-group gradient
    buffer (CPU) or the optimizer's pinned swap buffers and the first step's moments on their way to them (NVMe,
    [DS-lazy]), and the parameter swap buffers with the parameters kept in CPU (`max_in_cpu`) when parameters swap
    to NVMe."""
    p = shape.optimized_params
    terms: dict[str, int] = {}
    if strategy.zero_stage >= 3 and strategy.offload_optimizer != "none":
        subgroup = optimizer_subgroup_numel(p, world, buckets.sub_group_size, shape.largest_optimized_numel)
        if strategy.offload_optimizer == "nvme":
            terms["optimizer swap buffers (pinned)"] = optimizer_swap_buffer_bytes(
                subgroup, buckets.optimizer_buffer_count
            )
            # [DS-lazy] the first step's moments, unpinned: the whole partition's when pipelined, else a sub-group's
            held = -(-p // world) if buckets.pipeline else subgroup
            terms[FIRST_STEP_MOMENTS] = 2 * strategy.state_bytes * held
        else:
            terms["sub-group gradient buffer"] = subgroup * strategy.state_bytes
    if strategy.offload_param == "nvme":
        terms["param swap buffers (pinned)"] = param_swap_buffer_bytes(
            buckets.param_buffer_count, buckets.param_buffer_size
        )
        terms["params kept in CPU (max_in_cpu)"] = min(buckets.max_in_cpu, shape.params // world) * BYTES_16BIT
    return terms


# ------------------------------------------------------------------------------------- ZenFlow, SuperOffload


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


def super_offload_host_terms() -> dict[str, int]:
    """[SuperOffload] per rank on the host: the CPU-Adam worker process's own baseline."""
    return {"SuperOffload CPU-Adam process": PROCESS_BASELINE_BYTES_CPU}


# ------------------------------------------------------------------------------------- activations offloaded


def offloaded_activation_numels(
    seq_len: int, micro_batch: int, hidden: int, layers: int, vocab: int, cross_attention_layers: int = 0
) -> list[int]:
    """[act-offload] the bytes of each tensor save_on_cpu moves per micro-batch: the 16-bit hidden states each
    stack saves (each block's input, the final norm's input and output: L + 2; memory.py [enc-dec] an
    encoder-decoder has two stacks, L + 4, the encoder's output read by the decoder's cross-attention among them)
    and the fp32 logits."""
    tokens = seq_len * micro_batch
    stacks = 2 if cross_attention_layers else 1
    return [BYTES_16BIT * tokens * hidden] * (layers + 2 * stacks) + [BYTES_FP32 * tokens * vocab]


def offloaded_activation_bytes(
    shape: ModelShape, seq_len: int, micro_batch: int, *, cuda: bool, round_limit: int | None
) -> int:
    """[act-offload] the pinned CPU RAM save_on_cpu's copies take per rank: each saved tensor its own allocation,
    rounded on CUDA ([torch-host])."""
    saved = offloaded_activation_numels(
        seq_len, micro_batch, shape.hidden_size, shape.num_layers, shape.vocab_size, shape.cross_attention_layers
    )
    return sum(pinned_bytes(b, round_limit) if cuda else b for b in saved)


# ------------------------------------------------------------------------------------- all of them


def offload_host_terms(
    shape: ModelShape,
    strategy: Strategy,
    buckets: Buckets,
    *,
    world: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    has_gpu: bool,
    pin_memory: bool,
    round_limit: int | None,
    grad_accum: int,
) -> dict[str, int]:
    """Per-rank host RAM beside the model states: the offloaded activations ([act-offload]), the swap and staging
    buffers (host_buffer_bytes), the pinned buffers and their rounding (pinned_host_terms) and the offload
    processes ([SuperOffload], [ZenFlow]). `has_gpu`: the ranks run CUDA (pinned memory is rounded only there)."""
    terms: dict[str, int] = {}
    if strategy.offload_activations == "cpu" and checkpointing:
        terms["offloaded activations (pinned)"] = offloaded_activation_bytes(
            shape, seq_len, micro_batch, cuda=has_gpu, round_limit=round_limit
        )
    terms |= host_buffer_bytes(shape, strategy, buckets, world=world)
    terms |= pinned_host_terms(
        shape,
        strategy,
        buckets,
        world=world,
        cuda=has_gpu,
        pin_memory=pin_memory,
        round_limit=round_limit,
        grad_accum=grad_accum,
    )
    if strategy.zero_stage >= 3 and strategy.offload_param == "cpu" and has_gpu and pin_memory:
        terms["zero.Init partitions (cached pinned blocks)"] = init_partition_cache_bytes(
            shape, buckets.param_persistence_threshold, world=world, round_limit=round_limit
        )
    if strategy.super_offload:
        terms |= super_offload_host_terms()
    if strategy.zenflow_interval:
        terms |= zenflow_host_terms(shape.optimized_params, world)
    return terms
