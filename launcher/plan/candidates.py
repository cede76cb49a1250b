"""One candidate: a strategy sized (memory.py) and timed (timing.py) for a model, a host and a workload. The planner
(planner.py) and its refinements of the framework's strategies (modes.py) build every candidate here.

Pure, like the planner: same inputs, same Candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.inspection.hostprofile import HostProfile
from launcher.plan import memory, timing
from launcher.plan.calibration import calibrate
from launcher.plan.capacity import fit_problems, model_shape, size_buckets
from launcher.plan.memory import Buckets, MemoryEstimate, Strategy
from launcher.plan.timing import Rates, StepEstimate
from launcher.plan.workload import Workload


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


def step_shape(model, workload: Workload, micro_batch: int, grad_accum: int) -> timing.Shape:
    """What the step-time model needs of the model and the workload (an encoder-decoder's both stacks: timing
    [enc-dec])."""
    return timing.Shape(
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
    )


def estimate_candidate(
    model,
    host,
    workload: Workload,
    strategy: Strategy,
    rates: Rates,
    world: int,
    ranks: int,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    alloc_conf: str | None = None,
    calibration: dict | None = None,
) -> Candidate:
    """Size and time one strategy (optionally at another micro-batch / accumulation, for advice). `alloc_conf`:
    the ranks' PYTORCH_ALLOC_CONF (Plan.alloc_conf), which decides how torch rounds the pinned buffers;
    `calibration`: strategy label -> calibration.Factors from finished runs on this host. With the optimizer on
    NVMe, pipelined swaps (capacity.nvme_optimizer_sizing) are kept only where they fit and are predicted faster
    than the serial swapper (timing [DS-pipe]: with few sub-groups or a short CPU-Adam they are not)."""
    args = (model, host, workload, strategy, rates, world, ranks, micro_batch, grad_accum, alloc_conf, calibration)
    pipelined = _estimate(*args, size_buckets(model, host, strategy, world, ranks))
    if not pipelined.buckets.pipeline:
        return pipelined
    serial = _estimate(*args, size_buckets(model, host, strategy, world, ranks, nvme_pipeline=False))
    faster = pipelined.timing.expected_seconds < serial.timing.expected_seconds
    return pipelined if pipelined.fits and (faster or not serial.fits) else serial


def _estimate(
    model, host, workload, strategy, rates, world, ranks, micro_batch, grad_accum, alloc_conf, calibration, buckets
) -> Candidate:
    """estimate_candidate with the buckets decided."""
    micro_batch = micro_batch or workload.micro_batch
    grad_accum = grad_accum or workload.grad_accum
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
        pinned_round_limit=memory.pinned_round_limit(alloc_conf),
        grad_accum=grad_accum,
    )
    # [Twin-Flow] on the CPU accelerator the "GPU" share is CPU memory that CPU-Adam steps: timed as a full offload
    gpu_share = memory.optimizer_gpu_share(shape, strategy, buckets, world) if host.has_gpu else 0.0
    step = timing.estimate_step(
        step_shape(model, workload, micro_batch, grad_accum),
        strategy,
        rates,
        world=world,
        ranks_per_node=ranks,
        has_gpu=host.has_gpu,
        pinned=pinned,
        gpu_share=gpu_share,
        pipelined_groups=-(-model.params // world // buckets.sub_group_size) if buckets.pipeline else 0,
    )
    step = calibrate(step, (calibration or {}).get(strategy.label))
    return Candidate(strategy, buckets, estimate, fit_problems(strategy, estimate, host), step)


def pins_host_memory(strategy: Strategy, host: HostProfile) -> bool:
    """pin_memory for the offloaded buffers: on with a GPU (DeepSpeed's default since 0.19.5), whatever
    RLIMIT_MEMLOCK says. torch pins through its CUDA caching host allocator (cudaHostAlloc, or
    cudaHostRegister with pinned_use_cuda_host_register), and the NVIDIA driver locks those pages itself
    (open-gpu-kernel-modules os-mlock.c `os_lock_user_pages`: get_user_pages, no RLIMIT_MEMLOCK accounting),
    not through mlock(2), so `ulimit -l` does not bound them. Off on the CPU accelerator: nothing to DMA."""
    return host.has_gpu or not strategy.offloads
