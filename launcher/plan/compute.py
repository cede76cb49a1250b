"""The compute side of a step: FLOPs per token, the passes' seconds, the backward's share, the optimizer's compute.

P = parameters, N = ranks in all, R = ranks per node, t = tokens per micro-batch, M = micro-batches per optimizer step
(timing.py). One function per term, each citing its source.

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
  [LoRA-bwd]  Hu et al. 2021, "LoRA", §4.2: "a 25% speedup during training on GPT-3 175B compared to full fine-tuning
              as we do not need to calculate the gradient for the vast majority of the parameters" (footnote 5: 32.5
              against 43.1 tokens/s per V100, 0.754x the time). A frozen weight's backward computes the input
              gradient only: 2 FLOPs per parameter per token instead of [seeds-F]'s 4, so a frozen base costs
              4·P (6·P recomputed) and is read from device memory once less ([roofline]); the adapter's own
              parameters cost the full 6·P (8·P). Where the probe timed full fine-tuning's passes, they are scaled by
              the FLOPs' ratio (an assumption: the passes scale with their FLOPs).
  [non-matmul] The elementwise work of a block (normalisations, rotary embedding, activation, residual adds,
              casts, head reshapes) moves bytes in proportion to tokens x hidden and computes almost nothing, so
              it runs at device memory bandwidth. Counted for a Llama block in eager PyTorch (HF transformers):
              each RMSNorm reads and writes the hidden state ~6 times with its fp32 upcast (2 x ~30·h B), rotary
              embedding ~50·h B over q and k, the head reshapes ~12·h B, attention's q, k, v in and o out 8·h B,
              the gated MLP's activation and product ~10 x intermediate ≈ 27·h B, two residual adds 12·h B:
              ~170·h B per token in the forward, twice that in the backward, once more when recomputed.
              [enc-dec] A cross-attention sublayer moves its own norm's ~30·h, the head reshapes' ~12·h, q, k, v in
              and o out 8·h and a residual add 6·h: ~56·h B per token.
  [seeds-A]   CPU-Adam streams the fp32 state through DRAM once per step. The seeds count 12 B/param (master,
              m, v); the loop reads them and the fp32 gradient (16 B) and writes master, m, v back (12 B): 28 B/param
              (DeepSpeed csrc/includes/cpu_adam_impl.h, Step_AVX: loads params, grads, exp_avg, exp_avg_sq; stores
              params, exp_avg, exp_avg_sq). t = 28·P / bandwidth when nothing measured the rate
              (rates.py ADAM_BYTES_PER_PARAM).
  [bf16-states] With 16-bit optimizer states (strategy.py [DS-bf16s]) every state-sized byte above halves: CPU-Adam
              streams 4 loads and 3 stores of 2 B (14 B/param instead of 28: its measured fp32 rate scaled by
              28/14, an assumption - the loop is taken as memory-bound, as [seeds-A]), the norm reads and the
              narrowing copies 2 B (2 + 2 + 2 B instead of 10), the widening writes 2 B (2 + 2 instead of 6)
              (traffic.py [DS-step]).
  [Twin-Flow] With a partial optimizer offload (subgroups.py [Twin-Flow]) the GPU's share of the sub-groups is stepped
              by torch's AdamW on the device (device_optimizer_seconds), the rest by CPU-Adam, one sub-group after
              another (stage3.py `step` -> `_optimizer_step`), so the update costs both in proportion to their shares;
              only the CPU's share crosses PCIe back as updated 16-bit weights and runs DeepSpeed's host copies. The
              16-bit gradients still go down whole (`grad_partitions_flat_buffer` is on the CPU either way).
"""

from __future__ import annotations

from launcher.plan.rates import ADAM_BYTES_PER_PARAM, Rates
from launcher.plan.shapes import Shape
from launcher.plan.strategy import BYTES_16BIT, BYTES_FP32, Strategy

# [non-matmul] bytes per token per unit of hidden size of one block's forward elementwise work, and of an
# encoder-decoder's cross-attention sublayer's ([enc-dec]: a norm 30, reshapes 12, q/k/v/o 8, a residual add 6).
NONMATMUL_BYTES_PER_HIDDEN = 170
NONMATMUL_CROSS_BYTES_PER_HIDDEN = 30 + 12 + 8 + 6
# [roofline] times a 16-bit weight is read per micro-batch: once in the forward, twice in the backward, once more
# in the recomputed forward.
WEIGHT_READS = 3
WEIGHT_READS_RECOMPUTE = 4


def flops_per_token(
    params: int,
    recompute: bool,
    layers: int = 0,
    hidden: int = 0,
    seq_len: int = 0,
    cross_layers: int = 0,
    frozen: int = 0,
) -> int:
    """[seeds-F] 6·P (forward 2·P + backward 4·P), 8·P when activations are recomputed; plus [Narayanan] the
    attention's 12·L·s·d (16·L·s·d recomputed), when the shape is given (`hidden`: the attention width d). An
    encoder-decoder ([enc-dec]): per source-target pair of positions, P both stacks' parameters, L both stacks'
    blocks, and `cross_layers` more attention sublayers, the decoder's cross-attention. [LoRA-bwd] `frozen` of the
    `params` have no weight gradient: 2 FLOPs less each."""
    weights = (8 if recompute else 6) * params - 2 * frozen
    attention = (16 if recompute else 12) * (layers + cross_layers) * seq_len * hidden
    return weights + attention


def compute_seconds(shape: Shape, rates: Rates) -> float:
    """The passes' own work per optimizer step (M micro-batches): measured at the model's shapes when the probe
    timed them (L x a block + the rest), else [seeds-F]/[Narayanan] FLOPs at the device's rate, no faster than
    the [roofline] floor of streaming the weights from device memory."""
    width = shape.attention_width or shape.hidden
    flops = flops_per_token(
        shape.compute_params, shape.recompute, shape.layers, width, shape.seq_len, shape.cross_layers, shape.frozen
    )
    if rates.passes_per_layer_seconds is not None and rates.passes_fixed_seconds is not None:
        per_micro_batch = shape.layers * rates.passes_per_layer_seconds + rates.passes_fixed_seconds
        scale = shape.tokens_per_micro_batch / rates.passes_tokens if rates.passes_tokens else 1.0
        if shape.frozen:  # [LoRA-bwd] the probe timed full fine-tuning's passes
            scale *= flops / flops_per_token(
                shape.compute_params, shape.recompute, shape.layers, width, shape.seq_len, shape.cross_layers
            )
        return per_micro_batch * scale * shape.grad_accum  # another micro-batch (batch advice): in proportion
    tokens = shape.tokens_per_micro_batch * shape.grad_accum
    t_flops = flops * tokens / rates.compute_flops_per_s
    bandwidth = rates.device_memory_bytes_per_s
    if not bandwidth:
        return t_flops
    passes = 4 if shape.recompute else 3  # the backward counts twice [non-matmul]
    per_token = NONMATMUL_BYTES_PER_HIDDEN * shape.layers + NONMATMUL_CROSS_BYTES_PER_HIDDEN * shape.cross_layers
    t_elementwise = passes * per_token * shape.hidden * tokens / bandwidth
    reads = WEIGHT_READS_RECOMPUTE if shape.recompute else WEIGHT_READS
    # [LoRA-bwd] a frozen weight is read once less: no weight gradient
    t_weights = (reads * shape.compute_params - shape.frozen) * BYTES_16BIT * shape.grad_accum / bandwidth
    return max(t_flops, t_weights) + t_elementwise


def backward_share(recompute: bool, frozen_share: float = 0.0) -> float:
    """The backward's share of a micro-batch's compute: 4·P of 6·P FLOPs per token, 6·P of 8·P when the forward is
    recomputed in it ([seeds-F]); [LoRA-bwd] 2 FLOPs less per frozen parameter (`frozen_share` of them)."""
    backward = (6 if recompute else 4) - 2 * frozen_share
    return backward / (backward + 2)


def device_optimizer_seconds(params: int, world: int, rates: Rates) -> float:
    """The optimizer on the GPU (no offload): fused Adam streams the same [seeds-A] bytes as CPU-Adam, and the fp32
    master is copied into the 16-bit weights (read 4, write 2: stage_1_and_2.py / stage3.py `step`), through device
    memory; 0 when the bandwidth is not known. DeepSpeed's own passes around it: framework.py [DS-gpu-step]."""
    if not rates.device_memory_bytes_per_s:
        return 0.0
    return (ADAM_BYTES_PER_PARAM + BYTES_FP32 + BYTES_16BIT) * params / world / rates.device_memory_bytes_per_s


def cpu_adam_seconds(params: int, world: int, ranks_per_node: int, rates: Rates, torch_adam: bool = False) -> float:
    """[seeds-A] each rank updates its partition with its share of the node's cores, all ranks at once
    (`torch_adam`: torch's fused AdamW, the CPU accelerator's optimizer when nothing is offloaded)."""
    return params / world / rates.adam_params_per_s_per_rank(ranks_per_node, torch_adam)


def plain_optimizer_seconds(params: int, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool) -> float:
    """The optimizer where it runs with nothing offloaded: on the GPU, or torch's fused AdamW on the CPU
    accelerator."""
    if has_gpu:
        return device_optimizer_seconds(params, world, rates)
    return cpu_adam_seconds(params, world, ranks_per_node, rates, True)


def optimizer_seconds(
    params: int, strategy: Strategy, world: int, ranks_per_node: int, rates: Rates, has_gpu: bool, gpu_share: float
) -> float:
    """The optimizer's step per optimizer step, where it runs: without offload where the weights are (fused on the
    GPU, or on the CPU accelerator the same memory-bound CPU loop as CPU-Adam); offloaded, CPU-Adam on the host's
    share ([bf16-states]: half the bytes with 16-bit states) and [Twin-Flow] torch's AdamW on the GPU's."""
    optimizer_on_cpu = strategy.offload_optimizer != "none" or not has_gpu
    if not optimizer_on_cpu:
        return device_optimizer_seconds(params, world, rates)
    host_share = 1.0 - gpu_share  # [Twin-Flow] what CPU-Adam steps
    # on the CPU accelerator without offload: torch's fused AdamW (dsconfig.uses_torch_adam)
    no_offload = strategy.offload_optimizer == "none"
    t_adam = cpu_adam_seconds(params, world, ranks_per_node, rates, torch_adam=no_offload) * host_share
    t_adam *= strategy.state_bytes / BYTES_FP32  # [bf16-states]: half the bytes with 16-bit states
    if gpu_share:  # [Twin-Flow] the GPU's share: torch's AdamW on the device
        t_adam += gpu_share * device_optimizer_seconds(params, world, rates)
    return t_adam
