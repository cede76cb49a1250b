"""The memory model against the seeds' worked numbers and DeepSpeed's own estimators."""

from __future__ import annotations

import pytest

from launcher.inspection.hostspec import load_host_spec
from launcher.plan import host_buffers, memory, subgroups
from launcher.plan.memory import model_states
from launcher.plan.shapes import ModelShape
from launcher.plan.strategy import Buckets, Strategy
from tests.helpers import host_path

SEVEN_B = 7 * 10**9  # the seeds' round 7B


def total(tiers: dict) -> int:
    return sum(sum(t.values()) for t in tiers.values())


def test_seeds_16_bytes_per_param():
    assert total(model_states(SEVEN_B, Strategy(1), 1)) == 112 * 10**9  # "7B -> 112 GB"
    assert total(model_states(10 * 10**9, Strategy(1), 1)) == 160 * 10**9  # "10B -> 160 GB"


def test_seeds_zero_offload_split():
    tiers = model_states(SEVEN_B, Strategy(2, "cpu"), 1)
    assert sum(tiers["gpu"].values()) == 14 * 10**9  # "14 GB on GPU"
    assert sum(tiers["cpu"].values()) == 98 * 10**9  # "+ 98 GB on CPU"
    # the 10B worked example: 2Ψ = 20 GB of fp16 weights stay, 12Ψ = 120 GB of optimizer state moves
    ten = model_states(10 * 10**9, Strategy(2, "cpu"), 1)
    assert ten["gpu"]["fp16 weights"] == 20 * 10**9 and ten["cpu"]["fp32 optimizer states"] == 120 * 10**9


def test_seeds_zero3_on_8_gpus():
    assert total(model_states(SEVEN_B, Strategy(3), 8)) == 14 * 10**9  # "ZeRO-3 (8 GPUs) 14 GB"
    assert total(model_states(10 * 10**9, Strategy(3), 8)) == 20 * 10**9  # the README's 10B row


def test_readme_10b_zero_offload_row():
    tiers = model_states(10 * 10**9, Strategy(2, "cpu"), 1)
    assert sum(tiers["gpu"].values()) == 20 * 10**9 and sum(tiers["cpu"].values()) == 140 * 10**9


def test_zero_infinity_moves_everything_off_gpu():
    tiers = model_states(SEVEN_B, Strategy(3, "nvme", "nvme"), 1)
    assert tiers["gpu"] == {} and tiers["cpu"] == {}
    assert sum(tiers["nvme"].values()) == 16 * SEVEN_B


def _buckets(**kw):
    fields = dict(
        reduce_bucket_size=4096**2,
        allgather_bucket_size=4096**2,
        prefetch_bucket_size=int(0.9 * 4096**2),
        param_persistence_threshold=40960,
        sub_group_size=10**9,
        optimizer_buffer_count=4,
        param_buffer_count=5,
        param_buffer_size=10**8,
        max_in_cpu=10**9,
    )
    fields.update(kw)
    return Buckets(**fields)


SHAPE = ModelShape(
    params=SEVEN_B,
    largest_param_numel=131_072_000,
    layer_params=202_383_360,
    num_layers=32,
    hidden_size=4096,
    vocab_size=32000,
    persistent_params=0,
)


def _estimate(strategy, world=1, ranks=1, **kw):
    return memory.estimate(
        SHAPE,
        strategy,
        _buckets(),
        world=world,
        ranks_per_node=ranks,
        seq_len=2048,
        micro_batch=1,
        checkpointing=True,
        has_gpu=True,
        **kw,
    )


# DeepSpeed's estimators count model states only, with additional_buffer_factor=1.5 on CPU. Our model
# replaces that blanket factor by explicit buffer terms, so the comparison is on the state terms.
STATE_TERMS = (
    "fp16 weights",
    "fp16 gradients",
    "fp32 optimizer states",
    "fp32 gradient partition",
    "fp32 gradient partition (step)",
)


def states_only(terms: dict) -> int:
    return sum(v for k, v in terms.items() if k in STATE_TERMS)


@pytest.mark.parametrize("world", [1, 4])
def test_zero2_offload_cpu_matches_deepspeed_estimator(world):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cpu, gpu = estimate_zero2_model_states_mem_needs(
        SEVEN_B, num_gpus_per_node=world, cpu_offload=True, additional_buffer_factor=1.0
    )
    ours = _estimate(Strategy(2, "cpu"), world=world, ranks=world)
    assert states_only(ours.gpu_terms) == gpu  # 2Ψ of fp16 weights
    # DeepSpeed: Ψ·max(4·N, 16) per node; ours: (12 + 4 fp32 grad) Ψ/N per rank x N ranks = 16Ψ
    assert states_only(ours.cpu_terms) == cpu == 16 * SEVEN_B


def test_zero2_no_offload_matches_deepspeed_estimator():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _cpu, gpu = estimate_zero2_model_states_mem_needs(SEVEN_B, num_gpus_per_node=8, cpu_offload=False)
    assert states_only(_estimate(Strategy(2), world=8, ranks=8).gpu_terms) == gpu  # 2Ψ + 18Ψ/N


@pytest.mark.parametrize("offload_param", ["none", "cpu"])
def test_zero3_offload_cpu_matches_deepspeed_estimator(offload_param):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cpu, gpu, _largest_layer_bytes = estimate_zero3_model_states_mem_needs(
        SEVEN_B,
        SHAPE.layer_params,
        num_gpus_per_node=2,
        cpu_offload=True,
        cpu_offload_params=offload_param == "cpu",
        zero_init=True,
        additional_buffer_factor=1.0,
    )
    ours = _estimate(Strategy(3, "cpu", offload_param), world=2, ranks=2)
    assert states_only(ours.cpu_terms) == cpu  # 16Ψ (or 18Ψ with the fp16 params) per node
    # DeepSpeed's GPU figure is 4 B x largest layer (+ 2Ψ/N without param offload); ours gathers 2 B x
    # (largest layer + largest tensor) and adds buckets and activations, so it is strictly larger.
    assert ours.gpu_bytes_per_device > gpu


def test_activation_checkpointing_shrinks_activations():
    full = memory.activation_bytes(2048, 1, 4096, 32, checkpointing=False)
    ckpt = memory.activation_bytes(2048, 1, 4096, 32, checkpointing=True)
    assert full == 34 * 2048 * 4096 * 32  # Korthikanti et al. 34·s·b·h per layer
    assert ckpt == 2 * 2048 * 4096 * 32 + 34 * 2048 * 4096
    assert memory.activation_bytes(2048, 4, 4096, 32, False) == 4 * full


def test_nvme_param_swap_buffers_are_pinned_in_cpu():
    est = _estimate(Strategy(3, "nvme", "nvme"))
    assert est.cpu_terms["param swap buffers (pinned)"] == 5 * 10**8 * 2
    assert est.nvme_terms["fp16 weights"] == 2 * SEVEN_B
    assert est.nvme_terms["fp32 gradient partition"] == 4 * SEVEN_B


def test_cpu_accelerator_counts_device_memory_in_ram():
    est = memory.estimate(
        SHAPE,
        Strategy(2),
        _buckets(),
        world=1,
        ranks_per_node=1,
        seq_len=128,
        micro_batch=1,
        checkpointing=True,
        has_gpu=False,
    )
    assert "CUDA context" not in est.gpu_terms
    assert est.cpu_terms["device memory (CPU accelerator)"] == est.gpu_bytes_per_device


# ------------------------------------------------------------------ pinned host memory (issue 13, item 4)

# Llama-2-70B-like: 68,976,648,192 params over 8 ranks -> an 8.62e9-element partition, 34.5 GB in fp32:
# above 2^35 B (32 GiB), so torch's caching host allocator takes 64 GiB for it.
SEVENTY_B = ModelShape(
    params=68_976_648_192,
    largest_param_numel=262_144_000,
    layer_params=855_654_400,
    num_layers=80,
    hidden_size=8192,
    vocab_size=32000,
    persistent_params=0,
)
GiB = 2**30


def _estimate_shape(shape, strategy, world, **kw):
    return memory.estimate(
        shape,
        strategy,
        _buckets(),
        world=world,
        ranks_per_node=world,
        seq_len=2048,
        micro_batch=1,
        checkpointing=True,
        has_gpu=kw.pop("has_gpu", True),
        **kw,
    )


def test_zero2_offload_70b_pins_partitions_rounded_and_the_16bit_staging_buffer():
    est = _estimate_shape(SEVENTY_B, Strategy(2, "cpu"), 8)
    partition = SEVENTY_B.params // 8
    per_rank = {k: v // 8 for k, v in est.cpu_terms.items()}
    assert per_rank["16-bit staging partition"] == 2 * partition
    assert per_rank["gradient staging buffer (largest param)"] == 2 * 262_144_000
    # fp32 master and fp32 grad: 34.5 GB -> 64 GiB each; 16-bit staging 17.2 GB -> 32 GiB; 524 MB -> 512 MiB
    rounding = (64 * GiB - 4 * partition) * 2 + (32 * GiB - 2 * partition) + (512 * 2**20 - 2 * 262_144_000)
    assert per_rank["pinned rounding (torch host allocator)"] == rounding
    pinned = sum(v for k, v in per_rank.items() if k != "process baseline")
    # per rank: the 12+4 B/param states, and the pinned buffers at their rounded sizes
    assert pinned == 8 * partition + 2 * 64 * GiB + 32 * GiB + 512 * 2**20


def test_zero3_offload_70b_pins_the_16bit_gradient_partition_and_each_subgroup_gradient():
    est = _estimate_shape(SEVENTY_B, Strategy(3, "cpu"), 8)
    partition = SEVENTY_B.params // 8
    per_rank = {k: v // 8 for k, v in est.cpu_terms.items()}
    assert per_rank["16-bit gradient partition"] == 2 * partition
    groups = subgroups.stage3_subgroup_numels(
        partition, 10**9, subgroups.optimizer_subgroup_numel(SEVENTY_B.params, 8, 10**9, SEVENTY_B.largest_param_numel)
    )
    assert len(groups) == 9 and sum(groups) >= partition
    # 17.2 GB -> 32 GiB, and each ~4.1 GB fp32 sub-group gradient -> 4 GiB / 8 GiB
    expected = 32 * GiB - 2 * partition + sum(host_buffers.pinned_bytes(4 * k) - 4 * k for k in groups)
    assert per_rank["pinned rounding (torch host allocator)"] == expected


def test_small_model_rounding_and_what_turns_it_off():
    small = ModelShape(
        params=124_439_808,
        largest_param_numel=38_597_376,
        layer_params=7_087_872,
        num_layers=12,
        hidden_size=768,
        vocab_size=50257,
        persistent_params=0,
    )
    est = _estimate_shape(small, Strategy(2, "cpu"), 1)
    # 497.8 MB fp32 -> 512 MiB (twice), 248.9 MB 16-bit staging -> 256 MiB, 77.2 MB grad buffer -> 128 MiB
    p, big = small.params, small.largest_param_numel
    assert est.cpu_terms["16-bit staging partition"] == 2 * p
    assert est.cpu_terms["pinned rounding (torch host allocator)"] == (
        2 * (512 * 2**20 - 4 * p) + (256 * 2**20 - 2 * p) + (128 * 2**20 - 2 * big)
    )
    # exact sizes: pinning off, the CPU accelerator (pin_memory() is a no-op), or the allocator's limit
    for kw in (
        {"pin_memory": False},
        {"has_gpu": False},
        {"pinned_round_limit": host_buffers.PINNED_ROUND_LIMIT_BYTES},
    ):
        exact = _estimate_shape(small, Strategy(2, "cpu"), 1, **kw)
        assert "pinned rounding (torch host allocator)" not in exact.cpu_terms, kw
        assert exact.cpu_terms["16-bit staging partition"] == 2 * p


def test_zero3_param_offload_flat_buffer_is_pinned_even_without_pin_memory():
    est = _estimate_shape(SEVENTY_B, Strategy(3, "nvme", "cpu"), 8, pin_memory=False)
    partition = SEVENTY_B.params // 8
    assert est.cpu_terms["pinned rounding (torch host allocator)"] == 8 * (32 * GiB - 2 * partition)


def test_gradient_accumulation_pins_a_buffer_per_param():
    shape = ModelShape(**{**SHAPE.__dict__, "param_numels": (131_072_000, 50_000_000)})
    one = _estimate_shape(shape, Strategy(2, "cpu"), 1)
    four = _estimate_shape(shape, Strategy(2, "cpu"), 1, grad_accum=4)
    assert "gradient accumulation buffers" not in one.cpu_terms
    extra = (256 * 2**20 - 2 * 131_072_000) + (128 * 2**20 - 2 * 50_000_000)
    assert four.cpu_terms["gradient accumulation buffers"] == 2 * (SEVEN_B + 2 * 131_072_000) + extra


# ------------------------------------------------------------------ ZeRO-3 live parameters (issue 13, item 7)


def test_zero3_gpu_counts_the_live_parameter_bound():
    est = _estimate(Strategy(3), world=8, ranks=8)
    # [DS-live] max(max_live 1e9, reuse 1e9) + current module + prefetch overshoot, both the largest tensor;
    # the old "gathered layer" counted 202M + 131M elements, a third of what DeepSpeed may keep live
    assert est.gpu_terms["live parameters"] == 2 * (10**9 + 2 * 131_072_000)
    assert "gathered layer" not in est.gpu_terms
    smaller = memory.estimate(
        SHAPE,
        Strategy(3),
        _buckets(max_live_parameters=10**8, max_reuse_distance=2 * 10**8),
        world=8,
        ranks_per_node=8,
        seq_len=2048,
        micro_batch=1,
        checkpointing=True,
        has_gpu=True,
    )
    assert smaller.gpu_terms["live parameters"] == 2 * (2 * 10**8 + 2 * 131_072_000)


def test_live_parameters_never_exceed_the_partitioned_model():
    tiny = ModelShape(
        params=4_000_000,
        largest_param_numel=1_000_000,
        layer_params=500_000,
        num_layers=4,
        hidden_size=256,
        vocab_size=4000,
        persistent_params=10_000,
    )
    est = _estimate_shape(tiny, Strategy(3), 2)
    assert est.gpu_terms["live parameters"] == 2 * (4_000_000 - 10_000)


def test_per_plan_live_parameter_limit_is_two_blocks_at_most_deepspeeds_default():
    assert memory.zero3_live_parameter_limit(202_383_360) == 404_766_720  # Llama-2-7B block
    assert memory.zero3_live_parameter_limit(855_654_400) == 10**9  # Llama-2-70B: DeepSpeed's default


# ------------------------------------------------------------------------------------------ model families (issue 16)


def test_korthikanti_at_the_attention_width_is_34_sbh_where_it_equals_h():
    """[Korth] a block holds s·b·(26·h + 8·d): the attention's Q, K, V and output-projection input at its width d."""
    s, b, h = 512, 2, 1024
    assert memory.activation_bytes(s, b, h, 1, False, attention_width=h) == 34 * s * b * h
    assert memory.activation_bytes(s, b, h, 1, False, attention_width=16 * h) == (26 + 8 * 16) * s * b * h


def test_an_encoder_decoder_holds_its_cross_attention_and_the_encoder_output():
    """[enc-dec] 24 encoder + 24 decoder blocks at d = h: 34·s·b·h each, 13·s·b·h more per decoder block for its
    cross-attention, and the encoder's output (2·s·b·h) once."""
    s, b, h = 512, 1, 1024
    full = memory.activation_bytes(s, b, h, 48, False, cross_attention_layers=24)
    assert full == (48 * 34 + 24 * 13 + 2) * s * b * h
    ckpt = memory.activation_bytes(s, b, h, 48, True, cross_attention_layers=24)
    assert ckpt == (2 * 48 + 2 + 34 + 13) * s * b * h  # the inputs, the encoder output, one decoder block
    one_stack = memory.activation_bytes(s, b, h, 48, True)
    assert one_stack == (2 * 48 + 34) * s * b * h  # a causal LM's, as before


def test_t5_11b_activations_and_offloaded_tensors():
    from launcher.inspection.model import inspect_model
    from launcher.plan.capacity import model_shape, size_buckets

    t5 = inspect_model("t5-11b")
    h, d, s = 1024, 16_384, 512
    assert (
        memory.activation_bytes(s, 1, h, 48, True, cross_attention_layers=24, attention_width=d)
        == ((2 * 48 + 2) * h + (26 * h + 8 * d) + (5 * h + 8 * d)) * s
    )
    saved = host_buffers.offloaded_activation_numels(s, 1, h, 48, 32_128, cross_attention_layers=24)
    assert len(saved) == 48 + 4 + 1  # each block's input, each stack's final norm in and out, the logits
    host = load_host_spec(host_path("1x-a100-80g"))
    shape = model_shape(t5, size_buckets(t5, host, Strategy(3, "cpu"), 1, 1))
    assert (shape.cross_attention_layers, shape.attention_width, shape.num_layers) == (24, d, 48)
