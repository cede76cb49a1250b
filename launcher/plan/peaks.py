"""Peak memory: host RAM per node and memory per device at each moment of a run, and the moment each tier peaks.

memory.py counts the steady state, from the first optimizer step on. A run passes through other moments first and
after, each with its own transients; what must fit is the largest of them. The moments, in run order:

  load            from_pretrained: the weights, read from the checkpoint or initialised
  engine init     deepspeed.initialize: ZeRO flattens and partitions the weights, builds the fp32 master partition
  optimizer step  the steady state (memory.estimate's terms): Adam's moments exist from the first step on
  checkpoint save save_checkpoint: torch.save copies each storage that lives on a GPU to host RAM, one at a time
  export          the 16-bit model gathered for OUT/final, once Adam's moments are freed

P = parameters, N = data-parallel world size, R = ranks per node, b = 2 (16-bit). Sources, DeepSpeed 0.19.8,
transformers 5.24 and torch 2.13 as installed:
  [HF-load] transformers modeling_utils.py `_load_pretrained_model` and core_model_loading.py `_materialize_copy`:
            safetensors tensors are views of the file's mmap (page cache: shared by every rank mapping the file,
            clean and reclaimable); only a dtype cast makes an anonymous copy, b·P per rank. A model without weights
            (from_config) is initialised in anonymous memory on every rank: b·P each. Under ZeRO-3 (zero.Init) only
            rank 0 reads values, into the page cache, and every parameter is partitioned as it is built.
  [DS-lazy-adam] ops/adam/cpu_adam.py `step`: `if len(state) == 0: state['exp_avg'] = torch.zeros_like(...)`
            (and exp_avg_sq): Adam's moments are created at the first step, not at engine init
            (stage_1_and_2.py `initialize_optimizer_states` and stage3.py's take no step).
  [DS-flatten] stage_1_and_2.py __init__: the 16-bit parameters are flattened on the device when
            `available_memory() >= flat_buffer_bytes` (the weights and their flat copy, 2·b·P, side by side), else
            moved to the CPU first (`param.cpu_data = param.data.cpu()`) and flattened there: 2·b·P of host RAM per
            rank for that moment. On DeepSpeed's CPU accelerator the device is this node's RAM.
  [DS-pin-copy] accelerator.pin_memory(t) is `t.pin_memory()`: a pinned copy of a pageable tensor, both alive until
            the pageable one is dropped. stage_1_and_2.py pins the fp32 master partition that way (4·P/N per rank).
  [DS-defrag] stage3.py __init__ without parameter offload: `defragment()` (zero/utils.py) stages every partition
            in one pageable CPU buffer (b·P/N per rank) before copying it back to a flat device buffer; it runs
            (`_create_fp16_partitions_with_defragmentation`) before the swapper and the optimizer's buffers exist.
  [torch-save] torch serialization.py `_save`: storages are written one at a time; a device storage is copied to
            host RAM first (`storage.cpu()`); host storages are written in place. DeepSpeed's state_dict()s hold
            references: ZeRO-1/2's module state is views of the flat 16-bit buffer (one storage, b·P, written by
            data-parallel rank 0), each rank's fp32 master partition is one storage (4·P/N; ZeRO-3: one per
            sub-group), as are Adam's moments.
  [merge]   rank/adapter.export_merged (--lora --merge): after the adapter's export, rank 0 loads the base again
            in CPU RAM (b·P), merges the adapter into it (peft merge_and_unload: W + alpha/r·B·A, a transient of
            the largest weight's size) and saves it, while the engine still holds its state.
  [DS-export] engine.py `_zero3_consolidated_16bit_state_dict`: rank 0 gathers every parameter and keeps
            `param.detach().cpu()`: b·P of host RAM on the first node; ZeRO-1/2's `module.state_dict()` are device
            views that safetensors writes tensor by tensor (the largest tensor, b·L, at a time). Before it, the
            trainer drops Adam's moments (rank/export.drop_optimizer_state): the export adds to the engine's state
            without them.
"""

from __future__ import annotations

from launcher.plan.host_buffers import FIRST_STEP_MOMENTS
from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import BYTES_16BIT, BYTES_FP32, Strategy

LOAD, INIT, STEP, SAVE, EXPORT = "load", "engine init", "optimizer step", "checkpoint save", "export"
MOMENTS = (LOAD, INIT, STEP, SAVE, EXPORT)
# Adam's two moments out of the optimizer-states term's three (master, m, v) [DS-lazy-adam]
LAZY_MOMENTS_SHARE = 2 / 3


def host_moments(
    shape: ModelShape,
    strategy: Strategy,
    cpu_terms: dict[str, int],
    gpu_terms: dict[str, int],
    *,
    world: int,
    ranks_per_node: int,
    has_gpu: bool,
    baseline: int,
    gpu_room: int | None,
    weights_copied: bool,
    merge: bool = False,
) -> dict[str, int]:
    """Host RAM per node at each moment. `cpu_terms`, `gpu_terms`: the steady state (memory.estimate: per node, per
    device; on the CPU accelerator the device's terms are host RAM, counted in `cpu_terms` too); `baseline`: one
    rank's process; `gpu_room`: a GPU's usable bytes (None: unknown, taken as room enough); `weights_copied`: the load
    makes an anonymous copy of the weights on every rank ([HF-load]: a cast, or no weights to map); `merge`: the export
    also rebuilds a merged model ([merge])."""
    p, n, r = shape.params, world, ranks_per_node
    steady = sum(cpu_terms.values())
    weights = BYTES_16BIT * p
    # [HF-load] before the engine exists: the processes and what each rank holds of the weights
    if strategy.zero_stage >= 3:
        load = r * baseline + (0 if has_gpu else r * weights // n)  # zero.Init partitions; the device is RAM on CPU
    else:
        load = r * (baseline + (weights if weights_copied or not has_gpu else 0))
    # [DS-lazy-adam] the engine holds the steady state without Adam's moments, plus its own transients
    states = cpu_terms.get(strategy.states_term, 0) + (0 if has_gpu else r * gpu_terms.get(strategy.states_term, 0))
    # with the optimizer on NVMe, the first step's moments wait in RAM for their swap buffers (host_buffers [DS-lazy])
    engine = steady - int(states * LAZY_MOMENTS_SHARE) - cpu_terms.get(FIRST_STEP_MOMENTS, 0)
    init = engine
    if strategy.zero_stage < 3:
        if strategy.offload_optimizer == "cpu" and has_gpu:
            # [DS-pin-copy] the master partition, pageable and pinned
            init += r * BYTES_FP32 * shape.optimized_params // n
        # [DS-flatten] flattens the trainable weights only (memory.py [DS-frozen]); the frozen base stays as loaded
        flat = BYTES_16BIT * shape.optimized_params
        host_flatten = has_gpu and gpu_room is not None and weights + flat > gpu_room
        if host_flatten or not has_gpu:  # [DS-flatten] the weights and their flat copy side by side in host RAM
            init = max(init, r * (baseline + weights + flat))
    elif strategy.offload_param == "none":  # [DS-defrag] before any optimizer buffer exists (trainable partitions)
        init = max(engine, load + r * BYTES_16BIT * shape.optimized_params // n)
    save = steady + _save_transient(shape, strategy, world=n, ranks_per_node=r, has_gpu=has_gpu)
    # [DS-export] after rank/export.drop_optimizer_state freed Adam's moments
    # an adapter's export gathers the adapter alone (rank/adapter.py export_adapter)
    gathered = BYTES_16BIT * shape.trainable_params if shape.trainable_params else weights
    export = engine + (gathered if strategy.zero_stage >= 3 else BYTES_16BIT * shape.largest_optimized_numel)
    if merge:  # [merge] rank 0 rebuilds the base in CPU RAM, the adapter merged in, beside the engine
        export += weights + BYTES_16BIT * shape.largest_param_numel
    return {LOAD: int(load), INIT: int(init), STEP: steady, SAVE: save, EXPORT: export}


def _save_transient(shape: ModelShape, strategy: Strategy, *, world: int, ranks_per_node: int, has_gpu: bool) -> int:
    """[torch-save] the largest device storage each rank copies to host RAM while it writes its checkpoint files,
    all ranks of the node at once; nothing on the CPU accelerator, whose storages are host RAM already."""
    if not has_gpu:
        return 0
    p, n, r = shape.optimized_params, world, ranks_per_node  # an adapter's checkpoint holds the adapter alone
    per_rank = 0
    if strategy.offload_optimizer == "none":
        per_rank = BYTES_FP32 * p // n * strategy.state_bytes // BYTES_FP32  # the master partition (or a moment)
    module = BYTES_16BIT * p if strategy.zero_stage < 3 else 0  # data-parallel rank 0: the flat 16-bit buffer
    return r * per_rank + module


def device_moments(steady: int) -> dict[str, int]:
    """Bytes per device at each moment: the steady state bounds them all. The transients on the device are smaller
    than what the steady state adds after them: ZeRO-1/2 flattens on the device only when the copy fits beside the
    weights ([DS-flatten]), before any optimizer state exists; ZeRO-3's gathers at load, save and export take one
    module at a time, within the steady state's live parameters."""
    return dict.fromkeys(MOMENTS, steady)


def peak(moments: dict[str, int]) -> tuple[str, int]:
    """(the moment, its bytes) where `moments` peak; on a tie the optimizer step (the steady state a transient only
    equals), else the earliest."""
    moment = max(MOMENTS, key=lambda m: (moments.get(m, 0), m == STEP, -MOMENTS.index(m)))
    return moment, moments.get(moment, 0)
