"""One candidate: a strategy sized (memory.py) and timed (timing.py) for a model, a host and a workload (`Inputs`).
The planner (planner.py) and its refinements of the framework's strategies (modes.py) build every candidate here.

Pure, like the planner: same inputs, same Candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.inspection.hostprofile import HostProfile
from launcher.inspection.model import ModelProfile
from launcher.plan import host_buffers, memory, subgroups, timing
from launcher.plan.calibration import calibrate
from launcher.plan.capacity import fit_problems, model_shape, size_buckets, usable_gpu_bytes
from launcher.plan.memory import MemoryEstimate
from launcher.plan.rates import Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import Buckets, Strategy
from launcher.plan.timing import StepEstimate
from launcher.plan.workload import Workload, training_precision


@dataclass(frozen=True)
class Inputs:
    """What every candidate of one plan is sized and timed for: the arguments that travel together through
    estimate_candidate, the modes (modes.py) and the planner's hints and advice."""

    model: ModelProfile
    """The model (inspection/model.py)."""
    host: HostProfile
    """The host (inspection/hostprofile.py): its tiers' sizes, GPUs, nodes, NVMe folder."""
    workload: Workload
    """The resolved workload (workload.resolve): `seq_len` filled in."""
    rates: Rates
    """The rates the step-time model runs on, with the collectives' links (network.with_links)."""
    world: int
    """Ranks in all."""
    ranks: int
    """Ranks per node."""
    alloc_conf: str | None = None
    """The ranks' PYTORCH_ALLOC_CONF (Plan.alloc_conf), which decides how torch rounds the pinned buffers."""
    calibration: dict | None = None
    """Strategy label -> calibration.Factors from finished runs on this host (None: first principles only)."""
    buckets: dict | None = None
    """The buffer sizes a user's ds_config sets (config/merge.bucket_pins): the candidates are sized with them."""

    def uncalibrated(self, workload: Workload | None = None) -> Inputs:
        """The same inputs without calibration (what a hint or advice compares), optionally for another
        workload."""
        return replace(self, workload=workload or self.workload, calibration=None)


@dataclass(frozen=True)
class Candidate:
    strategy: Strategy
    buckets: Buckets
    memory: MemoryEstimate
    problems: tuple[str, ...]  # why it does not fit (empty when it fits)
    timing: StepEstimate

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            **self.strategy.to_json(),
            "label": self.strategy.label,
            "fits": self.fits,
            "problems": list(self.problems),
            **self.memory.to_json(),
            "estimates": self.timing.to_json(),
        }


def step_shape(model, workload: Workload, micro_batch: int, grad_accum: int) -> Shape:
    """What the step-time model needs of the model and the workload (an encoder-decoder's both stacks: compute.py
    [enc-dec])."""
    return Shape(
        params=model.params,
        compute_params=model.compute_params,
        layers=model.num_layers,
        hidden=model.hidden_size,
        param_tensors=len(model.param_numels),
        seq_len=workload.seq_len,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        recompute=workload.activation_checkpointing,
        vocab=model.vocab_size,
        cross_layers=model.cross_attention_layers,
        attention_width=model.attention_width,
        trainable=model.trainable_params,
    )


def estimate_candidate(
    inputs: Inputs, strategy: Strategy, micro_batch: int | None = None, grad_accum: int | None = None
) -> Candidate:
    """Size and time one strategy (optionally at another micro-batch / accumulation, for advice). With the
    optimizer on NVMe, pipelined swaps (capacity.nvme_optimizer_sizing) are kept only where they fit and are
    predicted faster than the serial swapper (timing [DS-pipe]: with few sub-groups or a short CPU-Adam they are
    not)."""
    model, host, world, ranks = inputs.model, inputs.host, inputs.world, inputs.ranks
    args = (inputs, strategy, micro_batch or inputs.workload.micro_batch, grad_accum or inputs.workload.grad_accum)
    pipelined = _estimate(*args, size_buckets(model, host, strategy, world, ranks, pinned=inputs.buckets))
    if not pipelined.buckets.pipeline:
        return pipelined
    serial = _estimate(
        *args, size_buckets(model, host, strategy, world, ranks, nvme_pipeline=False, pinned=inputs.buckets)
    )
    faster = pipelined.timing.expected_seconds < serial.timing.expected_seconds
    return pipelined if pipelined.fits and (faster or not serial.fits) else serial


def _estimate(inputs: Inputs, strategy: Strategy, micro_batch: int, grad_accum: int, buckets: Buckets) -> Candidate:
    """estimate_candidate with the batch and the buckets decided."""
    model, host, workload, world, ranks = inputs.model, inputs.host, inputs.workload, inputs.world, inputs.ranks
    pinned = pins_host_memory(strategy, host)
    shape = model_shape(model, buckets)
    estimate = memory.estimate(
        shape,
        strategy,
        buckets,
        world=world,
        ranks_per_node=ranks,
        seq_len=workload.seq_len,
        micro_batch=micro_batch,
        checkpointing=workload.activation_checkpointing,
        has_gpu=host.has_gpu,
        pin_memory=pinned,
        pinned_round_limit=host_buffers.pinned_round_limit(
            host_buffers.strategy_alloc_conf(inputs.alloc_conf, strategy)
        ),
        grad_accum=grad_accum,
        cuda_context_bytes=inputs.rates.cuda_context_bytes,
        gpu_room=usable_gpu_bytes(host) if host.has_gpu else None,
        weights_copied=weights_copied(model, training_precision(workload.precision, host)),
        merge=workload.merge,
    )
    # [Twin-Flow] on the CPU accelerator the "GPU" share is CPU memory that CPU-Adam steps: timed as a full offload
    gpu_share = subgroups.optimizer_gpu_share(shape, strategy, buckets, world) if host.has_gpu else 0.0
    step = timing.estimate_step(
        step_shape(model, workload, micro_batch, grad_accum),
        strategy,
        inputs.rates,
        world=world,
        ranks_per_node=ranks,
        has_gpu=host.has_gpu,
        pinned=pinned,
        gpu_share=gpu_share,
        pipelined_groups=-(-model.optimized_params // world // buckets.sub_group_size) if buckets.pipeline else 0,
    )
    step = calibrate(step, (inputs.calibration or {}).get(strategy.label))
    return Candidate(strategy, buckets, estimate, fit_problems(strategy, estimate, host), step)


# the precisions a run trains in, as a config.json states a checkpoint's dtype
TRAINING_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def weights_copied(model: ModelProfile, precision: str) -> bool:
    """Whether loading the model leaves an anonymous copy of its weights on every rank (peaks.py [HF-load]): no
    weights to map (initialised: a local folder with a config alone), or a checkpoint in another dtype, or one whose
    config does not say."""
    if model.source == "local" and not model.has_weights:
        return True
    return model.weights_dtype != TRAINING_DTYPES.get(precision)


def pins_host_memory(strategy: Strategy, host: HostProfile) -> bool:
    """pin_memory for the offloaded buffers: on with a GPU (DeepSpeed's default since 0.19.5), whatever
    RLIMIT_MEMLOCK says. torch pins through its CUDA caching host allocator (cudaHostAlloc, or
    cudaHostRegister with pinned_use_cuda_host_register), and the NVIDIA driver locks those pages itself
    (open-gpu-kernel-modules os-mlock.c `os_lock_user_pages`: get_user_pages, no RLIMIT_MEMLOCK accounting),
    not through mlock(2), so `ulimit -l` does not bound them. Off on the CPU accelerator: nothing to DMA."""
    return host.has_gpu or not strategy.offloads
