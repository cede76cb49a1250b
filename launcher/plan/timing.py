"""Step-time model: the seeds' race between moving bytes and computing, per candidate strategy.

One function per term, each citing its source. P = parameters, N = ranks in all, R = ranks per node,
t = tokens per micro-batch (micro-batch x sequence length), M = micro-batches per optimizer step (accumulation).
A step has two phases, which the trainer measures separately (launcher/rank/progress.py PhaseClock):
"passes" (forward and backward of every micro-batch, with what they overlap) and "update" (the optimizer step).

Sources:
  [seeds-F]   "CPU Offload Math": a step costs ~6·P FLOPs per token (forward + backward); activation
              recomputation adds a forward, ~8·P (the seeds' "8 with recomputation").
  [Narayanan] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", eq. 3:
              the attention scores and their weighted sum add 4·s·h FLOPs per token per layer to a forward
              (12·s·h with the backward, 16·s·h with recomputation), beside the weights' 2 FLOPs per parameter.
              The h there is the attention's inner width d = a·d_head (Q·K^T is 2·s·d per query, the weighted sum
              of V another 2·s·d), which the paper takes equal to h, as for every causal LM bundled here; T5-11B's
              is 128 x 128 = 16·h, so its terms are counted at d.
  [enc-dec]   (memory.py [enc-dec]) An encoder-decoder at --seq-len s: s source tokens through the encoder, s target
              tokens through the decoder. Each encoder weight multiplies each source token once and each decoder
              weight each target token once (the cross-attention's key and value projections take the encoder's s
              output tokens), so a source-target pair of positions costs [seeds-F]'s 6·P (8·P recomputed) with P
              both stacks' parameters - 6·(P_encoder + P_decoder)·s FLOPs per pair of sequences; a tied embedding
              counts once, as the head's matmul over the target. Each decoder block's cross-attention adds
              [Narayanan]'s 4·s·d per target token over the s source tokens, so the attention terms count
              L_encoder + 2·L_decoder attention sublayers. tokens/s counts the s positions of each pair once, as
              for a causal LM at --seq-len s. One stack (a causal LM, or an encoder such as BERT, whose attention
              over all s tokens costs what the counted s·s scores of a causal LM cost) has no cross-attention.
  [roofline]  Williams, Waterman, Patterson 2009, "Roofline": a pass runs no faster than its weights stream from
              device memory; each 16-bit weight is read once per forward and twice per backward (the input
              gradient and the weight gradient), so below ~peak/bandwidth tokens per micro-batch the passes are
              memory-bound, not compute-bound.
  [non-matmul] The elementwise work of a block (normalisations, rotary embedding, activation, residual adds,
              casts, head reshapes) moves bytes in proportion to tokens x hidden and computes almost nothing, so
              it runs at device memory bandwidth. Counted for a Llama block in eager PyTorch (HF transformers):
              each RMSNorm reads and writes the hidden state ~6 times with its fp32 upcast (2 x ~30·h B), rotary
              embedding ~50·h B over q and k, the head reshapes ~12·h B, attention's q, k, v in and o out 8·h B,
              the gated MLP's activation and product ~10 x intermediate ≈ 27·h B, two residual adds 12·h B:
              ~170·h B per token in the forward, twice that in the backward, once more when recomputed.
              [enc-dec] A cross-attention sublayer moves its own norm's ~30·h, the head reshapes' ~12·h, q, k, v in
              and o out 8·h and a residual add 6·h: ~56·h B per token.
  [seeds-B]   ZeRO-Offload moves 2 B/param of 16-bit gradients down and 2 B/param of updated 16-bit weights
              up per optimizer step: 4 B/param, the minimum, independent of the batch. DeepSpeed's compact
              gradient partition buffer accumulates on the GPU and copies once at the step boundary
              (stage_1_and_2.py `copy_grads_in_partition`).
  [seeds-A]   CPU-Adam streams the fp32 state through DRAM once per step. The seeds count 12 B/param (master,
              m, v); the loop reads them and the fp32 gradient (16 B) and writes master, m, v back (12 B): 28 B/param
              (DeepSpeed csrc/includes/cpu_adam_impl.h, Step_AVX: loads params, grads, exp_avg, exp_avg_sq; stores
              params, exp_avg, exp_avg_sq). t = 28·P / bandwidth when nothing measured the rate.
  [DS-step]   What DeepSpeed does in host memory around CPU-Adam, read in stage_1_and_2.py / stage3.py: the
              16-bit gradients are widened into the fp32 partition (read 2 B, write 4 B per param; on the CPU
              accelerator a host copy during the backward, on a GPU part of the overlapped transfer); the step
              reads that partition for the norm (`complete_grad_norm_calculation_for_cpu_offload`, 4 B), CPU-Adam
              runs (not fused with the copy back: `_optimizer_step` calls plain `optimizer.step()`), and
              `_update_model_bit16_weights` narrows the fp32 master into the 16-bit copy (read 4 B, write 2 B):
              10 B/param in the update besides the 28 B CPU-Adam streams, at the rank's share of the bandwidth.
  [ZeRO-Inf]  Rajbhandari et al. 2021, "ZeRO-Infinity": with parameters offloaded, each rank fetches its
              16-bit partition before the forward and again before the backward of every micro-batch;
              with the optimizer on NVMe the fp32 master, m, v (12 B) are read in and written out once per
              step, a sub-group at a time, the write of one overlapping the read of the next
              (partitioned_optimizer_swapper.py), so the slower direction sets the time. The fp32 gradients'
              swap (4 B) goes out during the backward and is not charged: the bench's NVMe rows measure update
              phases of 0.44-0.62 of the summed 16 B read + 16 B written.
  [DS-hooks]  ZeRO-3 gathers and releases each parameter from Python hooks around every module's forward and
              backward (partitioned_param_coordinator.py `fetch_sub_module` / `release_sub_module`,
              parameter_offload.py's pre/post hooks): a cost per parameter tensor and pass, whatever its size,
              that dominates small models (DeepSpeed issues 1189 and 2637: ZeRO-3 several times slower than
              ZeRO-2 on small models). ZeRO-1/2 with the optimizer offloaded copies each gradient to the host
              partition from its own backward hook (stage_1_and_2.py `copy_grads_in_partition`): a cost per tensor
              and micro-batch. Beside those per-tensor costs, ZeRO's per-parameter work (bucket copies, averaging,
              partition copies, gathers into the full-size buffer) streams bytes per parameter and micro-batch
              through host memory on the CPU accelerator (ZERO_PASS_BYTES_PER_PARAM). All are measured, see
              their comments.
  [seeds-O]   "The swap math": overlapped work costs max(t_compute, t_move), serial work the sum.
              DeepSpeed overlaps gradient copies with the backward (overlap_comm); the CPU-Adam step,
              the weight upload after it, parameter fetches and the NVMe swap are charged serially.
  [bf16-states] With 16-bit optimizer states (memory.py [DS-bf16s]) every state-sized byte above halves: CPU-Adam
              streams 4 loads and 3 stores of 2 B (14 B/param instead of 28: its measured fp32 rate scaled by
              28/14, an assumption - the loop is taken as memory-bound, as [seeds-A]), the norm reads and the
              narrowing copies 2 B (2 + 2 + 2 B instead of 10), the widening writes 2 B (2 + 2 instead of 6).
  [Twin-Flow] With a partial optimizer offload (memory.py [Twin-Flow]) the GPU's share of the sub-groups is stepped
              by torch's AdamW on the device (device_optimizer_seconds), the rest by CPU-Adam, one sub-group after
              another (stage3.py `step` -> `_optimizer_step`), so the update costs both in proportion to their shares;
              only the CPU's share crosses PCIe back as updated 16-bit weights and runs DeepSpeed's host copies. The
              16-bit gradients still go down whole (`grad_partitions_flat_buffer` is on the CPU either way).
  [DS-pipe]   With offload_optimizer.pipeline_read / pipeline_write (capacity.nvme_optimizer_sizing) DeepSpeed's
              PipelinedOptimizerSwapper reads sub-group i+1 and writes sub-group i-1 from their own aio handles while
              sub-group i steps (stage3.py `_optimizer_states_and_gradient_swap_in` / `_swap_out`, with the async
              swap ops): the swaps run beside CPU-Adam instead of before and after it, so the update costs the
              longer of the two, plus the first read and the last write, which nothing hides (one sub-group of G
              each: the swap time / G).
  [ZenFlow]   (memory.py [ZenFlow]) The device updates the selected top-k share of the parameters every step, at the
              device optimizer's rate; the host updates the rest once per update_interval U steps in its own process,
              asynchronously, while the next U steps' passes compute: only the part of that update (CPU-Adam, its host
              copies, the weights' upload) that outlasts U passes stalls, spread over the U steps. On the CPU
              accelerator the optimizer process takes cores from the passes (ZenFlow's pt_reserved_cores_perc splits
              them), so nothing is hidden: its update is charged in full, spread over the U steps. This follows the
              design (Lan et al. 2025, "ZenFlow: Enabling Stall-Free Offloading Training via Asynchronous Updates");
              the e2e test measures it here, no published GPU run is in tests/plan/published_runs.yaml yet.
  [act-offload] With the activations offloaded (memory.py [act-offload]) each saved tensor goes to the host in the
              forward, synchronously (`pack_to_cpu` copy_ into a pinned tensor), and comes back in the backward: twice
              its bytes across PCIe per micro-batch, charged serially in the passes.
  [SuperOffload] (memory.py [SuperOffload]) CPU-Adam steps each bucket as its gradients arrive, so the update
              overlaps the backward (about 2/3 of the passes' compute, 3/4 with recomputation) and only what outlasts it
              waits, then the weights come back across the link. From the design, not yet checked against a run.
  [network]   The collectives between the ranks (ZeRO's gradient reductions and parameter gathers) on the slower of
              the GPUs' links inside a node and the nodes' network: plan/network.py, which cites its sources.
  [pageable]  A copy from pageable host memory cannot be DMAed directly: the CUDA driver stages it through a
              pinned bounce buffer, one extra CPU memcpy per chunk, and the copy is synchronous (CUDA C++
              Best Practices Guide, "Pinned Memory"; M. Harris, "How to Optimize Data Transfers in CUDA
              C/C++", NVIDIA blog 2012, bandwidthTest pinned vs pageable). `offload-launch probe` measures
              both (rates.py `measure_pcie`); without a measured pageable figure the model assumes half the
              pinned rate (PAGEABLE_TO_PINNED), an assumption, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from launcher.plan import network
from launcher.plan.memory import (
    BYTES_16BIT,
    BYTES_FP32,
    OPTIMIZER_BYTES_PER_PARAM,
    ZENFLOW_TOPK_RATIO,
    Strategy,
    offloaded_activation_numels,
)

# Changed whenever a change to this file, or to how its measured inputs are taken, changes what it predicts: finished
# runs calibrate later plans only through the version that predicted them (plan/calibration.py). ".2": the passes at
# the model's shapes are a median of rounds, no longer the best (inspection/passes.py).
MODEL_VERSION = "2026-12-02.2"
# [pageable] pageable / pinned host<->device bandwidth when no pageable rate was measured (an assumption).
PAGEABLE_TO_PINNED = 0.5
MFU = 0.5  # achievable fraction of a GPU's peak dense TFLOP/s in training (PaLM reports 46 %, Chowdhery 2022)
# [seeds-A] DRAM bytes per parameter of one Adam step: reads master, gradient, m, v; writes master, m, v.
ADAM_BYTES_PER_PARAM = 16 + 12


def host_update_bytes(state_bytes: int) -> int:
    """[DS-step] per parameter in the update: the norm's read and the narrowing's read of the state-sized master
    and gradient, the 16-bit write: 10 B with fp32 states, 6 with bf16 ([bf16-states])."""
    return 2 * state_bytes + BYTES_16BIT


def host_widen_bytes(state_bytes: int) -> int:
    """[DS-step] per parameter and micro-batch on the CPU accelerator: the 16-bit gradient read, the state-sized
    write: 6 B with fp32 states, 4 with bf16 ([bf16-states])."""
    return BYTES_16BIT + state_bytes


# [DS-step] host memory bytes per parameter around CPU-Adam: the norm's read (4), the narrowing (4 + 2) in the update;
# the widening of the gradients (2 + 4) per micro-batch, a host copy in the passes on the CPU accelerator.
HOST_UPDATE_BYTES_PER_PARAM = host_update_bytes(BYTES_FP32)
HOST_WIDEN_BYTES_PER_PARAM = host_widen_bytes(BYTES_FP32)
# [non-matmul] bytes per token per unit of hidden size of one block's forward elementwise work, and of an
# encoder-decoder's cross-attention sublayer's ([enc-dec]: a norm 30, reshapes 12, q/k/v/o 8, a residual add 6).
NONMATMUL_BYTES_PER_HIDDEN = 170
NONMATMUL_CROSS_BYTES_PER_HIDDEN = 30 + 12 + 8 + 6
# [roofline] times a 16-bit weight is read per micro-batch: once in the forward, twice in the backward, once more
# in the recomputed forward.
WEIGHT_READS = 3
WEIGHT_READS_RECOMPUTE = 4
# [DS-hooks] Measured on the CPU accelerator of docs/planning.md (2 cores) by two runs of `make bench`: each row's
# measured passes minus its passes measured without DeepSpeed (inspection/passes.py) is split by least squares over
# the ~1 M-, ~20 M- and ~100 M-parameter rows (39, 57 and 129 tensors) into a per-tensor and a per-parameter part,
# per strategy family. One set of constants for every row and for the GPU runs of tests/plan/published_runs.yaml.
# Seconds per parameter tensor per micro-batch, by family: ZeRO-3's hooks (a fetch and a release each forward and
# backward; with activation checkpointing also the recomputed forward's hooks, whose fetch the backward then finds
# gathered), what offloading the parameters adds, ZeRO-1/2's gradient hook (with the optimizer offloaded also the
# copy of each gradient into the CPU partition). Nominal: a host the probe measured uses its own
# (inspection/zero_costs.py, Rates.zero_tensor_seconds), since these are bound by one thread's speed. The nominal
# ZeRO-3 and offload figures are the least-squares fit above (0.8 ms per pass, 0.5 ms per fetch). ZeRO-1/2's hook
# without offload is not charged unmeasured: the probe finds 0.16-0.25 ms on the machine above, but that includes
# the gradient's copy into the contiguous buffer at this CPU's speed, which a GPU does as a device kernel, and
# charging it to the published A100 runs (tests/plan/published_runs.yaml) takes their ratios out of their band.
ZERO_TENSOR_SECONDS = {
    "zero3_hook": 2 * 0.8e-3,
    "zero3_hook_recompute": 3 * 0.8e-3,
    "zero3_fetch": 2 * 0.5e-3,
    "offload_hook": 0.66e-3,
    "zero12_hook": 0.0,
}
# ZeRO's per-parameter work per micro-batch on the CPU accelerator, as bytes through the rank's share of the host's
# memory bandwidth, by (ZeRO-3?, optimizer offloaded?, where the parameters live). On a GPU the same work runs as
# device kernels and is not charged: at HBM bandwidth it would add ~0.05 s to Qwen2.5-1.5B's 0.24 s ZeRO-2 step of
# tests/plan/published_runs.yaml, which the runs there do not show.
ZERO_PASS_BYTES_PER_PARAM = {
    (False, False, "none"): 36,
    (False, True, "none"): 72,
    (True, False, "none"): 85,
    (True, True, "none"): 85,
    (True, False, "cpu"): 93,
    (True, True, "cpu"): 93,
    (True, False, "nvme"): 93,
    (True, True, "nvme"): 93,
}
# DeepSpeed's own step with nothing offloaded (stage_1_and_2.py / stage3.py `step`: the gradient partition widened to
# fp32, its norm, the clip, the narrowing back, the gathers), on the CPU accelerator, as bytes per parameter through
# the host's memory beside the optimizer's own (on a GPU not charged, as ZERO_PASS_BYTES_PER_PARAM): the ~20 M- and
# ~100 M-parameter ZeRO-2 rows of `make bench` step at ~4.7 ns/param, of which the optimizer takes ~0.5; the rest at
# the probed 31 GB/s is ~130 B/param.
NO_OFFLOAD_STEP_BYTES_PER_PARAM = 130
# Seconds per optimizer step DeepSpeed's engine spends outside the work above (its step bookkeeping: loss scale,
# overflow check, scheduler, timers): the ~1 M-parameter ZeRO-2 + optimizer-on-CPU row's update phase minus CPU-Adam
# and the host copies.
STEP_FIXED_SECONDS = 1.5e-3


@dataclass(frozen=True)
class Rates:
    """The figures the model runs on, each with where it came from ("measured", "described", "nominal")."""

    compute_flops_per_s: float  # useful FLOP/s per rank (peak x MFU on a GPU)
    pcie_bytes_per_s: float  # host<->device from pinned memory, per direction, per GPU
    cpu_adam_params_per_s: float  # per node, all cores
    nvme_read_bytes_per_s: float  # per node
    nvme_write_bytes_per_s: float
    sources: dict  # figure name -> "measured" | "described" | "nominal"
    pcie_pageable_bytes_per_s: float | None = None  # the same from pageable memory, when measured
    cpu_memory_bytes_per_s: float | None = None  # the node's DRAM bandwidth (host copies; the CPU device's memory)
    device_memory_bytes_per_s: float | None = None  # a GPU's memory bandwidth (the [roofline] floor); None: none
    # CPU-Adam params/s of one rank by its thread count, measured (a rank gets OMP_NUM_THREADS = cores // R,
    # launch.LaunchSpec.threads_per_rank); empty: cpu_adam_params_per_s shared out over the R ranks
    cpu_adam_params_per_s_by_threads: dict = field(default_factory=dict)
    # torch's fused AdamW the same way: the CPU accelerator's optimizer when nothing is offloaded
    torch_adam_params_per_s_by_threads: dict = field(default_factory=dict)
    cpu_cores: int = 0  # per node
    # The passes measured at the model's shapes on this device (inspection/passes.py): seconds per micro-batch of
    # `passes_tokens` tokens for one more transformer block, and for the rest (embedding, head, loss, framework);
    # None: FLOPs at compute_flops_per_s
    passes_per_layer_seconds: float | None = None
    passes_fixed_seconds: float | None = None
    passes_tokens: int = 0
    # [network] the node's network to the other nodes and a GPU's link to the node's others, per direction (None: not
    # known; planner.make_plan fills them from the host, network.with_links)
    network_bytes_per_s: float | None = None
    interconnect_bytes_per_s: float | None = None
    # [DS-hooks] ZeRO's seconds per parameter tensor by family, measured on this host (inspection/zero_costs.py);
    # a family not in it: ZERO_TENSOR_SECONDS
    zero_tensor_seconds: dict = field(default_factory=dict)

    def zero_seconds(self, family: str) -> float:
        """ZeRO's seconds per parameter tensor of `family` (ZERO_TENSOR_SECONDS' keys): measured, else nominal."""
        return self.zero_tensor_seconds.get(family, ZERO_TENSOR_SECONDS[family])

    def host_device_bytes_per_s(self, pinned: bool) -> float:
        """The host<->device rate DeepSpeed's offload copies get: pinned, or pageable when pin_memory is off
        (measured, else PAGEABLE_TO_PINNED x pinned [pageable])."""
        if pinned:
            return self.pcie_bytes_per_s
        return self.pcie_pageable_bytes_per_s or self.pcie_bytes_per_s * PAGEABLE_TO_PINNED

    def adam_params_per_s_per_rank(self, ranks_per_node: int, torch_adam: bool = False) -> float:
        """One rank's Adam rate on the CPU while all R step at once: DeepSpeedCPUAdam's (or `torch_adam`: torch's
        fused AdamW's, when measured) at the rank's thread count, else the node's CPU-Adam rate shared out."""
        threads = max(1, self.cpu_cores // ranks_per_node) if self.cpu_cores else 0
        table = self.torch_adam_params_per_s_by_threads if torch_adam else self.cpu_adam_params_per_s_by_threads
        measured = table.get(threads) or self.cpu_adam_params_per_s_by_threads.get(threads)
        return measured or self.cpu_adam_params_per_s / ranks_per_node


@dataclass(frozen=True)
class Shape:
    """What the step-time model needs of the model and the workload."""

    params: int  # all parameters (they size the transfers and the optimizer)
    compute_params: int  # those that do matmul work per token (an untied input embedding does not)
    layers: int = 0
    hidden: int = 0
    param_tensors: int = 0  # parameter tensors (ZeRO-3 gathers and releases each one per pass)
    seq_len: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    recompute: bool = False
    vocab: int = 0  # the logits' width ([act-offload] moves the fp32 logits the loss keeps)
    cross_layers: int = 0  # [enc-dec] decoder blocks with a cross-attention sublayer (0: one stack)
    attention_width: int = 0  # [Narayanan] heads x head_dim where it differs from `hidden`; 0: `hidden`

    @property
    def tokens_per_micro_batch(self) -> int:
        """Positions per micro-batch: an encoder-decoder's s source and s target tokens count s ([enc-dec])."""
        return self.micro_batch * self.seq_len


@dataclass(frozen=True)
class StepEstimate:
    compute_seconds_per_step: float
    pcie_bytes_per_step: int  # per GPU
    pcie_seconds_per_step: float
    cpu_adam_seconds_per_step: float
    nvme_bytes_per_step: int  # per node
    nvme_seconds_per_step: float
    step_seconds: float
    tokens_per_s: float
    offload_overhead_fraction: float  # share of the step that offloading adds (transfers, CPU-Adam, swaps)
    host_copy_seconds_per_step: float = 0.0  # [DS-step] copies and conversions in host memory
    framework_seconds_per_step: float = 0.0  # [DS-hooks] ZeRO's own cost and the engine's per-step bookkeeping
    passes_seconds: float = 0.0  # the forward/backward phase (what the trainer measures as "passes")
    update_seconds: float = 0.0  # the optimizer-step phase ("update")
    # [network] what one rank sends around the ring per step (with several nodes also what each node's network carries
    # each way), and how long that takes at the ring's rate, hidden behind the backward or not
    collective_bytes_per_step: int = 0
    collective_seconds_per_step: float = 0.0
    # the same step scaled by what finished runs of this model and strategy with as many ranks on this host
    # measured (plan/calibration.py); None: no such runs
    calibrated_step_seconds: float | None = None
    calibration: dict | None = None  # the factors per phase and the number of runs they come from

    @property
    def expected_seconds(self) -> float:
        """What the plan ranks by: the calibrated step where finished runs calibrated it, else this model's."""
        return self.calibrated_step_seconds or self.step_seconds

    def to_json(self) -> dict:
        return {
            "compute_seconds_per_step": self.compute_seconds_per_step,
            "pcie_bytes_per_step": self.pcie_bytes_per_step,
            "pcie_seconds_per_step": self.pcie_seconds_per_step,
            "cpu_adam_seconds_per_step": self.cpu_adam_seconds_per_step,
            "host_copy_seconds_per_step": self.host_copy_seconds_per_step,
            "framework_seconds_per_step": self.framework_seconds_per_step,
            "nvme_bytes_per_step": self.nvme_bytes_per_step,
            "nvme_seconds_per_step": self.nvme_seconds_per_step,
            "collective_bytes_per_step": self.collective_bytes_per_step,
            "collective_seconds_per_step": self.collective_seconds_per_step,
            "passes_seconds": self.passes_seconds,
            "update_seconds": self.update_seconds,
            "step_seconds": self.step_seconds,
            "tokens_per_s": self.tokens_per_s,
            "offload_overhead_fraction": self.offload_overhead_fraction,
            "calibrated_step_seconds": self.calibrated_step_seconds,
            "calibration": self.calibration,
        }


def flops_per_token(
    params: int, recompute: bool, layers: int = 0, hidden: int = 0, seq_len: int = 0, cross_layers: int = 0
) -> int:
    """[seeds-F] 6·P (forward 2·P + backward 4·P), 8·P when activations are recomputed; plus [Narayanan] the
    attention's 12·L·s·d (16·L·s·d recomputed), when the shape is given (`hidden`: the attention width d). An
    encoder-decoder ([enc-dec]): per source-target pair of positions, P both stacks' parameters, L both stacks'
    blocks, and `cross_layers` more attention sublayers, the decoder's cross-attention."""
    weights = (8 if recompute else 6) * params
    attention = (16 if recompute else 12) * (layers + cross_layers) * seq_len * hidden
    return weights + attention


def compute_seconds(shape: Shape, rates: Rates) -> float:
    """The passes' own work per optimizer step (M micro-batches): measured at the model's shapes when the probe
    timed them (L x a block + the rest), else [seeds-F]/[Narayanan] FLOPs at the device's rate, no faster than
    the [roofline] floor of streaming the weights from device memory."""
    if rates.passes_per_layer_seconds is not None and rates.passes_fixed_seconds is not None:
        per_micro_batch = shape.layers * rates.passes_per_layer_seconds + rates.passes_fixed_seconds
        scale = shape.tokens_per_micro_batch / rates.passes_tokens if rates.passes_tokens else 1.0
        return per_micro_batch * scale * shape.grad_accum  # another micro-batch (batch advice): in proportion
    tokens = shape.tokens_per_micro_batch * shape.grad_accum
    width = shape.attention_width or shape.hidden
    flops = flops_per_token(
        shape.compute_params, shape.recompute, shape.layers, width, shape.seq_len, shape.cross_layers
    )
    t_flops = flops * tokens / rates.compute_flops_per_s
    bandwidth = rates.device_memory_bytes_per_s
    if not bandwidth:
        return t_flops
    passes = 4 if shape.recompute else 3  # the backward counts twice [non-matmul]
    per_token = NONMATMUL_BYTES_PER_HIDDEN * shape.layers + NONMATMUL_CROSS_BYTES_PER_HIDDEN * shape.cross_layers
    t_elementwise = passes * per_token * shape.hidden * tokens / bandwidth
    reads = WEIGHT_READS_RECOMPUTE if shape.recompute else WEIGHT_READS
    t_weights = reads * BYTES_16BIT * shape.compute_params * shape.grad_accum / bandwidth
    return max(t_flops, t_weights) + t_elementwise


def device_optimizer_seconds(params: int, world: int, rates: Rates) -> float:
    """The optimizer on the GPU (no offload): torch's fused AdamW streams the same [seeds-A] bytes as CPU-Adam,
    plus the 16-bit copy it writes, through device memory; 0 when the bandwidth is not known."""
    if not rates.device_memory_bytes_per_s:
        return 0.0
    return (ADAM_BYTES_PER_PARAM + BYTES_16BIT) * params / world / rates.device_memory_bytes_per_s


def no_offload_step_seconds(params: int, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool) -> float:
    """DeepSpeed's step around the optimizer when nothing is offloaded, on the CPU accelerator
    (NO_OFFLOAD_STEP_BYTES_PER_PARAM at the rank's share of the bandwidth); 0 on a GPU (see the constant)."""
    bandwidth = 0.0 if has_gpu else (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node
    return NO_OFFLOAD_STEP_BYTES_PER_PARAM * params / world / bandwidth if bandwidth else 0.0


@dataclass(frozen=True)
class Transfers:
    """Host<->device bytes per GPU per optimizer step, by when they move [seeds-B] [ZeRO-Inf]."""

    gradients: int = 0  # 16-bit gradients down, overlapped with the backward (overlap_comm)
    fetches: int = 0  # offloaded 16-bit parameters up, before each forward and backward: in the passes
    weights: int = 0  # updated 16-bit weights across after the optimizer step: in the update

    @property
    def total(self) -> int:
        return self.gradients + self.fetches + self.weights


def transfers(params: int, strategy: Strategy, world: int, grad_accum: int) -> Transfers:
    """Optimizer offloaded: gradients down (2 B/param, overlapped with backward) and updated weights up
    (2 B/param, after the CPU step) [seeds-B]. Parameters offloaded: the 16-bit partition is fetched for
    the forward and again for the backward of every micro-batch (2 x 2 B/param) [ZeRO-Inf]; with the optimizer
    on the host the updated weights then stay there (no upload); with the optimizer on the GPU the updated
    partition goes back down (2 B/param). The fetches are charged in full: prefetching hides only part of them
    in practice (DeepSpeed issue 3901, Falcon-7B on 8 x A100: ZeRO-3 2.86 s/step, with parameter offload
    6.05 s/step)."""
    partition = params // world
    gradients = fetches = weights = 0
    if strategy.offload_optimizer != "none":
        gradients = BYTES_16BIT * partition
        if strategy.offload_param == "none":
            weights = BYTES_16BIT * partition
    if strategy.offload_param != "none":
        fetches = 2 * BYTES_16BIT * partition * grad_accum
        if strategy.offload_optimizer == "none":
            weights = BYTES_16BIT * partition
    return Transfers(gradients, fetches, weights)


def pcie_bytes(params: int, strategy: Strategy, world: int, grad_accum: int) -> tuple[int, int]:
    """(overlapped, serial) host<->device bytes per GPU per optimizer step (`transfers`)."""
    moved = transfers(params, strategy, world, grad_accum)
    return moved.gradients, moved.fetches + moved.weights


def cpu_adam_seconds(params: int, world: int, ranks_per_node: int, rates: Rates, torch_adam: bool = False) -> float:
    """[seeds-A] each rank updates its partition with its share of the node's cores, all ranks at once
    (`torch_adam`: torch's fused AdamW, the CPU accelerator's optimizer when nothing is offloaded)."""
    return params / world / rates.adam_params_per_s_per_rank(ranks_per_node, torch_adam)


def host_bytes(
    params: int, strategy: Strategy, world: int, moved: Transfers, has_gpu: bool, accum: int
) -> tuple[int, int]:
    """(passes, update) bytes of host memory traffic per rank per optimizer step where the optimizer runs on the
    host (offloaded, or on the CPU accelerator): [DS-step]'s norm and narrowing in the update, and on the CPU
    accelerator the widening of each micro-batch's gradients in the passes and the transfers, which are memcpys
    there (each byte read and written)."""
    optimizer_on_host = strategy.offload_optimizer != "none" or not has_gpu
    update = host_update_bytes(strategy.state_bytes) * params // world if optimizer_on_host else 0
    passes = 0
    if not has_gpu:
        passes = host_widen_bytes(strategy.state_bytes) * params // world * accum + 2 * moved.fetches
        update += 2 * moved.weights
    return passes, update


def zero_tensor_seconds(strategy: Strategy, recompute: bool, rates: Rates) -> float:
    """[DS-hooks] ZeRO's cost per parameter tensor per micro-batch: ZeRO-3's gather/release hooks every pass (and
    fetches, with the parameters offloaded), ZeRO-1/2's gradient hook (and copy to the offloaded partition)."""
    if strategy.zero_stage >= 3:
        fetch = rates.zero_seconds("zero3_fetch") if strategy.offload_param != "none" else 0.0
        return rates.zero_seconds("zero3_hook_recompute" if recompute else "zero3_hook") + fetch
    return rates.zero_seconds("offload_hook" if strategy.offload_optimizer != "none" else "zero12_hook")


def zero_param_seconds(
    params: int, zero3: bool, offload_optimizer: str, offload_param: str, bandwidth: float, has_gpu: bool
) -> float:
    """[DS-hooks] ZeRO's per-parameter work per micro-batch on the CPU accelerator, `params` (a rank's share)
    through `bandwidth` (the rank's share of the host's memory bandwidth); on a GPU not charged (see
    ZERO_PASS_BYTES_PER_PARAM)."""
    if has_gpu or not bandwidth:
        return 0.0
    return ZERO_PASS_BYTES_PER_PARAM[(zero3, offload_optimizer != "none", offload_param)] * params / bandwidth


def framework_seconds(
    shape: Shape, strategy: Strategy, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool
) -> float:
    """[DS-hooks] ZeRO's own cost in the passes per optimizer step: per parameter tensor and per parameter, every
    micro-batch."""
    per_tensor = zero_tensor_seconds(strategy, shape.recompute, rates) * shape.param_tensors
    bandwidth = (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node
    per_param = zero_param_seconds(
        shape.params // world,
        strategy.zero_stage >= 3,
        strategy.offload_optimizer,
        strategy.offload_param,
        bandwidth,
        has_gpu,
    )
    return (per_tensor + per_param) * shape.grad_accum


def nvme_bytes(params: int, strategy: Strategy, world: int, ranks_per_node: int, grad_accum: int) -> tuple[int, int]:
    """(read, write) NVMe bytes per node per optimizer step [ZeRO-Inf]."""
    fetched, (read, write) = _nvme_parts(params, strategy, world, ranks_per_node, grad_accum)
    return fetched + read, write


def _nvme_parts(
    params: int, strategy: Strategy, world: int, ranks_per_node: int, grad_accum: int
) -> tuple[int, tuple[int, int]]:
    """(parameter reads in the passes, (read, write) in the update) NVMe bytes per node per step [ZeRO-Inf]."""
    per_node = params * ranks_per_node // world
    fetched = read = write = 0
    if strategy.offload_optimizer == "nvme":
        state = OPTIMIZER_BYTES_PER_PARAM * per_node  # master, m, v: in before the step, out after it
        read += state
        write += state
    if strategy.offload_param == "nvme":
        fetched = 2 * BYTES_16BIT * per_node * grad_accum  # forward + backward fetches
        write += BYTES_16BIT * per_node  # updated weights
    return fetched, (read, write)


def activation_copy_seconds(shape: Shape, strategy: Strategy, rates: Rates, has_gpu: bool, pinned: bool) -> float:
    """[act-offload] the saved tensors down in the forward and up in the backward, every micro-batch; on the CPU
    accelerator a host copy each way (read and write)."""
    if strategy.offload_activations == "none" or not shape.recompute:
        return 0.0
    saved = offloaded_activation_numels(
        shape.seq_len, shape.micro_batch, shape.hidden, shape.layers, shape.vocab, shape.cross_layers
    )
    moved = 2 * sum(saved)
    rate = rates.host_device_bytes_per_s(pinned) if has_gpu else (rates.cpu_memory_bytes_per_s or 0) / 2
    return moved * shape.grad_accum / rate if rate else 0.0


def zenflow_update_seconds(host_update: float, selective: float, passes: float, interval: int, has_gpu: bool) -> float:
    """[ZenFlow] the update phase per step: the device's selective update, and the part of the host's update (once
    per `interval` steps) that the next `interval` steps' passes do not hide, spread over them."""
    hidden = interval * passes if has_gpu else 0.0
    return selective + max(0.0, host_update - hidden) / interval


def estimate_step(
    shape: Shape,
    strategy: Strategy,
    rates: Rates,
    *,
    world: int,
    ranks_per_node: int,
    has_gpu: bool,
    pinned: bool = True,
    gpu_share: float = 0.0,
    pipelined_groups: int = 0,
) -> StepEstimate:
    """Both phases of one optimizer step [seeds-O]. Passes: the compute, or the gradient copies it overlaps when
    they take longer, then the ZeRO-3 hooks and the parameter fetches (PCIe, NVMe), which wait. Update: CPU-Adam,
    DeepSpeed's host copies, the weights across PCIe, the optimizer's NVMe swap, the engine's fixed cost.
    `pinned`: whether the offloaded host buffers are page-locked (pin_memory), which sets the copy rate;
    `pipelined_groups`: the optimizer's sub-groups per rank when its NVMe swaps are pipelined ([DS-pipe]; 0: serial);
    `gpu_share`: the optimizer's share a partial offload keeps on the GPU (memory.optimizer_gpu_share); 0 on the
    CPU accelerator, where that "device" is the CPU and DeepSpeed steps every sub-group with CPU-Adam (stage3.py
    `_optimizer_step`: cur_device == 'cpu')."""
    params, accum = shape.params, shape.grad_accum
    t_compute = compute_seconds(shape, rates)
    t_activations = activation_copy_seconds(shape, strategy, rates, has_gpu, pinned)
    moved = transfers(params, strategy, world, accum)
    host_share = 1.0 - gpu_share  # [Twin-Flow] what CPU-Adam steps, and uploads after
    moved = replace(moved, weights=int(moved.weights * host_share))
    host_passes, host_update = host_bytes(params, strategy, world, moved, has_gpu, accum)
    host_update = int(host_update * host_share)
    bandwidth = (rates.cpu_memory_bytes_per_s or 0) / ranks_per_node  # the rank's share: all ranks copy at once
    t_host_passes = host_passes / bandwidth if bandwidth else 0.0
    t_host_update = host_update / bandwidth if bandwidth else 0.0
    if not has_gpu:  # the CPU accelerator: no PCIe; its copies are the host traffic above
        moved = Transfers()
    pcie_rate = rates.host_device_bytes_per_s(pinned)
    t_gradients, t_fetches, t_weights = (b / pcie_rate for b in (moved.gradients, moved.fetches, moved.weights))
    # [seeds-O] the gradient copies hide behind the backward, unless [pageable]: a copy to pageable memory is
    # synchronous, so nothing overlaps
    t_overlapped = max(t_compute, t_gradients) if pinned else t_compute + t_gradients
    # Without offload the optimizer runs where the weights are: fused on the GPU, or on the CPU accelerator,
    # where it is the same memory-bound CPU loop as CPU-Adam.
    optimizer_on_cpu = strategy.offload_optimizer != "none" or not has_gpu
    no_offload = strategy.offload_optimizer == "none"
    if optimizer_on_cpu:  # on the CPU accelerator without offload: torch's fused AdamW (dsconfig.uses_torch_adam)
        t_adam = cpu_adam_seconds(params, world, ranks_per_node, rates, torch_adam=no_offload) * host_share
        t_adam *= strategy.state_bytes / BYTES_FP32  # [bf16-states]: half the bytes with 16-bit states
        if gpu_share:  # [Twin-Flow] the GPU's share: torch's AdamW on the device
            t_adam += gpu_share * device_optimizer_seconds(params, world, rates)
    else:
        t_adam = device_optimizer_seconds(params, world, rates)
    t_step = no_offload_step_seconds(params, world, ranks_per_node, rates, has_gpu) if no_offload else 0.0
    fetched, (read, write) = _nvme_parts(params, strategy, world, ranks_per_node, accum)
    t_nvme_passes = fetched / rates.nvme_read_bytes_per_s
    # [ZeRO-Inf] the swapper writes a sub-group out while it reads the next one in: the slower direction counts
    t_nvme_update = max(read / rates.nvme_read_bytes_per_s, write / rates.nvme_write_bytes_per_s)
    t_hooks = framework_seconds(shape, strategy, world, ranks_per_node, rates, has_gpu)
    comm = network.collective_times(shape, strategy, rates, world, ranks_per_node, t_compute)

    # [ZeRO-Inf] the parameter swapper prefetches from NVMe into its buffers while the passes compute
    passes = max(t_overlapped, t_nvme_passes) + t_hooks + t_fetches + t_host_passes + t_activations + comm.passes
    update = t_adam + t_step + t_host_update + t_weights + t_nvme_update + STEP_FIXED_SECONDS
    if strategy.super_offload:  # [SuperOffload] the update behind the backward, the upload after it
        backward = t_compute * network.backward_share(shape.recompute)
        update = max(0.0, t_adam + t_host_update - backward) + t_weights + STEP_FIXED_SECONDS
    if pipelined_groups and t_nvme_update:  # [DS-pipe] the swaps beside CPU-Adam, but the first read and last write
        on_host = t_adam + t_host_update
        update += max(on_host, t_nvme_update) + t_nvme_update / pipelined_groups - on_host - t_nvme_update
    if strategy.zenflow_interval:
        on_device = device_optimizer_seconds(params, world, rates) if has_gpu else None
        selective = ZENFLOW_TOPK_RATIO * (
            on_device if on_device is not None else cpu_adam_seconds(params, world, ranks_per_node, rates, True)
        )
        interval = strategy.zenflow_interval
        t_adam, t_host_update, t_weights = (t / interval for t in (t_adam, t_host_update, t_weights))
        moved = replace(moved, weights=moved.weights // interval)
        update = zenflow_update_seconds(
            interval * (t_adam + t_host_update + t_weights), selective, passes, interval, has_gpu
        )
        update += STEP_FIXED_SECONDS
    update += comm.update  # [network] the updated weights gathered after the step
    step = passes + update
    # what the step would cost with nothing offloaded: the passes, ZeRO's own cost and collectives, the engine's, the
    # optimizer where it would then run (on the GPU; the CPU accelerator's optimizer is on the CPU either way)
    without_offload = t_compute + t_hooks + comm.passes + comm.update + STEP_FIXED_SECONDS
    if not strategy.offloads:
        without_offload = step
    elif no_offload:
        without_offload += t_adam + t_step
    else:  # the optimizer where it would run: on the GPU, or torch's fused AdamW on the CPU accelerator
        on_device = device_optimizer_seconds(params, world, rates) if has_gpu else None
        adam = on_device if on_device is not None else cpu_adam_seconds(params, world, ranks_per_node, rates, True)
        without_offload += adam + no_offload_step_seconds(params, world, ranks_per_node, rates, has_gpu)
    tokens_per_step = shape.tokens_per_micro_batch * accum * world
    return StepEstimate(
        compute_seconds_per_step=t_compute,
        pcie_bytes_per_step=moved.total,
        pcie_seconds_per_step=t_gradients + t_fetches + t_weights,
        cpu_adam_seconds_per_step=t_adam,
        nvme_bytes_per_step=fetched + read + write,
        nvme_seconds_per_step=t_nvme_passes + t_nvme_update,
        step_seconds=step,
        tokens_per_s=tokens_per_step / step,
        offload_overhead_fraction=max(0.0, 1.0 - without_offload / step),
        host_copy_seconds_per_step=t_host_passes + t_host_update,
        framework_seconds_per_step=t_hooks + STEP_FIXED_SECONDS,
        passes_seconds=passes,
        update_seconds=update,
        collective_bytes_per_step=comm.bytes,
        collective_seconds_per_step=comm.seconds,
    )
