"""What the estimates need of the model and the workload.

ModelShape: the model numbers the memory model (memory.py), the host buffers (host_buffers.py) and the sub-groups
(subgroups.py) are computed from; a ModelProfile satisfies it, as do tests. Shape: what the step-time model
(timing.py, compute.py, traffic.py, framework.py, network.py) needs of the model and the workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.inspection.model import OptimizedCounts


@dataclass(frozen=True)
class ModelShape(OptimizedCounts):
    """The model numbers the estimate needs (a ModelProfile satisfies this, as do tests)."""

    params: int
    largest_param_numel: int
    layer_params: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    persistent_params: int  # elements in tensors below the persistence threshold
    param_numels: tuple[int, ...] = ()  # every tensor's numel (per-param pinned buffers); () when unknown
    # memory.py [enc-dec] decoder blocks with a cross-attention sublayer; 0: one stack
    cross_attention_layers: int = 0
    attention_width: int = 0  # memory.py [Korth] heads x head_dim where it differs from hidden_size; 0: hidden_size
    # adapters.py: the parameters the optimizer owns and their tensors (a LoRA's); 0 and (): all of them
    trainable_params: int = 0
    trainable_numels: tuple[int, ...] = ()
    adapter_saved_bytes_per_token: int = 0  # adapters.py [LoRA-act], all adapted layers


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
    vocab: int = 0  # the logits' width (traffic.py [act-offload] moves the fp32 logits the loss keeps)
    cross_layers: int = 0  # compute.py [enc-dec] decoder blocks with a cross-attention sublayer (0: one stack)
    attention_width: int = 0  # compute.py [Narayanan] heads x head_dim where it differs from `hidden`; 0: `hidden`
    trainable: int = 0  # adapters.py: the parameters that get weight gradients and an optimizer step; 0: all

    @property
    def optimized(self) -> int:
        """The parameters the optimizer steps and the gradients reduce: the adapter's, else all."""
        return self.trainable or self.params

    @property
    def frozen(self) -> int:
        """Compute parameters with no weight gradient (a LoRA's base): compute.py [LoRA-bwd]."""
        return self.compute_params - self.trainable if self.trainable else 0

    @property
    def tokens_per_micro_batch(self) -> int:
        """Positions per micro-batch: an encoder-decoder's s source and s target tokens count s ([enc-dec])."""
        return self.micro_batch * self.seq_len
