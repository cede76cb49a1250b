"""LoRA as a workload of the plan (launcher/plan/adapters.py): the adapter's parameters against peft's own count, the
default targets against peft's mapping, and the memory and time terms a frozen base changes."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec
from launcher.inspection.model import inspect_model
from launcher.plan import memory
from launcher.plan.adapters import (
    PEFT_DEFAULT_TARGETS,
    Lora,
    adapted,
    adapter_numels,
    resolve_targets,
    saved_bytes_per_token,
)
from launcher.plan.compute import backward_share, flops_per_token
from launcher.plan.network import collectives
from launcher.plan.planner import make_plan
from launcher.plan.rates import resolve_rates
from launcher.plan.strategy import Strategy
from launcher.plan.traffic import transfers
from launcher.plan.workload import Workload
from tests.helpers import host_path, save_config, tiny_llama_config


@pytest.fixture(scope="module")
def llama7b():
    return inspect_model("meta-llama/Llama-2-7b")


def plan_for(model, host: str, **workload):
    spec = load_host_spec(host_path(host))
    return make_plan(model, spec, Workload(**workload), resolve_rates(spec))


def test_the_adapter_counts_what_peft_builds(tmp_path):
    """r·(in + out) per adapted layer, summed: peft's own count on the same model (q,v and all-linear; r = 4, 16)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    folder = save_config(tiny_llama_config(num_key_value_heads=2), tmp_path / "tiny")
    profile = inspect_model(str(folder))
    for target, rank in (("auto", 4), ("all-linear", 16), ("k_proj,down_proj", 8)):
        targets = resolve_targets(profile, target)
        model = AutoModelForCausalLM.from_config(tiny_llama_config(num_key_value_heads=2))
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=rank, target_modules=list(targets)))
        trainable, _ = wrapped.get_nb_trainable_parameters()
        numels = [p.numel() for p in wrapped.parameters() if p.requires_grad]
        lora = Lora(rank, 2.0 * rank, 0.0, targets)
        assert sum(adapter_numels(profile, lora)) == trainable
        assert sorted(adapter_numels(profile, lora)) == sorted(numels)  # tensor by tensor too


def test_llama_2_7b_q_v_at_rank_8_is_peft_s_familiar_4_2_million(llama7b):
    assert resolve_targets(llama7b, "auto") == ("q_proj", "v_proj")
    assert sum(adapter_numels(llama7b, Lora(8, 16, 0, ("q_proj", "v_proj")))) == 4_194_304
    all_linear = resolve_targets(llama7b, "all-linear")
    assert "lm_head" not in all_linear and len(all_linear) == 7
    assert sum(adapter_numels(llama7b, Lora(8, 16, 0, all_linear))) == 19_988_480


def test_default_targets_copy_peft_s_mapping():
    peft_constants = pytest.importorskip("peft.utils.constants")
    mapping = peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type, targets in PEFT_DEFAULT_TARGETS.items():
        assert tuple(mapping[model_type]) == targets, model_type


def test_auto_falls_back_to_every_linear_layer_but_the_head(llama7b):
    """A family peft does not know (or whose names differ) gets all-linear, read from the model's own modules."""
    unknown = dataclasses.replace(llama7b, model_type="my-llama")
    assert resolve_targets(unknown, "auto") == resolve_targets(llama7b, "all-linear")


def test_unknown_target_names_list_the_model_s_layers(llama7b):
    with pytest.raises(UserInputError, match="qkv is not a linear layer.*q_proj, k_proj"):
        resolve_targets(llama7b, "q_proj,qkv")


def test_the_frozen_base_stays_whole_at_zero_1_2_and_partitions_at_zero_3(llama7b):
    """memory.py [DS-frozen]: 2 B per parameter of weights everywhere the stage puts weights, but gradients and the
    12 B of Adam only for the adapter."""
    lora = Lora(8, 16, 0, ("q_proj", "v_proj"))
    p, a = llama7b.params, 4_194_304
    states = memory.model_states(p + a, Strategy(2), 4, trainable=a)["gpu"]
    assert states["fp16 weights"] == 2 * (p + a)  # the base on every GPU: ZeRO-1/2 cannot partition it
    assert states["fp16 gradients"] == 2 * a // 4 and states["fp32 optimizer states"] == 12 * a // 4
    zero3 = memory.model_states(p + a, Strategy(3, "cpu", "cpu"), 4, trainable=a)
    assert zero3["cpu"]["fp16 weights"] == 2 * (p + a) // 4 and "fp16 weights" not in zero3["gpu"]
    assert adapted(llama7b, lora).optimized_params == a and adapted(llama7b, None) is llama7b


def test_the_adapter_s_saved_tensors_add_to_the_activations(llama7b):
    """adapters.py [LoRA-act]: 2·r B per adapted layer and token, and 3·in B more with dropout (the dropped-out input
    and its mask); with activation checkpointing only the recomputed block's."""
    targets = ("q_proj", "v_proj")
    assert saved_bytes_per_token(llama7b, Lora(8, 16, 0.0, targets)) == 64 * 2 * 8
    assert saved_bytes_per_token(llama7b, Lora(8, 16, 0.1, targets)) == 64 * (2 * 8 + 3 * 4096)
    with_dropout = plan_for(llama7b, "1x-a100-80g", lora=True, lora_dropout=0.1, zero_stage="2", seq_len=2048)
    assert with_dropout.chosen.memory.gpu_terms["adapter activations"] == 2 * (2 * 8 + 3 * 4096) * 2048


def test_a_frozen_weight_costs_no_weight_gradient():
    """compute.py [LoRA-bwd]: 4·P instead of 6·P per token (6 instead of 8 recomputed)."""
    assert flops_per_token(100, False, frozen=100) == 400 and flops_per_token(100, True, frozen=100) == 600
    assert backward_share(False, 1.0) == 0.5 and backward_share(True) == 0.75


def test_only_the_adapter_is_reduced_and_uploaded_but_zero_3_gathers_the_base():
    p, a = 1_000_000, 1_000
    z2 = collectives(p, Strategy(2), 2, 1, trainable=a)
    assert z2.reduce == 2 * a and z2.update == a and z2.gathers == 0  # (n-1)/n x 2 B = 1 B per param with 2 ranks
    z3 = collectives(p, Strategy(3), 2, 1, trainable=a)
    assert z3.gathers == 2 * p and z3.reduce == a
    moved = transfers(p, Strategy(3, "cpu", "cpu"), 1, 1, trainable=a)
    assert moved.fetches == 4 * p and moved.gradients == 2 * a and moved.weights == 0


def test_lora_on_a_24g_gpu_needs_no_offload_where_full_fine_tuning_does(llama7b):
    """The issue's case: Llama-2-7B on one 24 GB GPU. Full fine-tuning only fits with offload; the plan says what a
    LoRA would cost (never switching), and with --lora it trains without offload and says what full fine-tuning
    would need."""
    full = plan_for(llama7b, "1x-rtx4090-24g")
    assert full.chosen.strategy.offloads and full.lora is None
    assert full.method_advice["method"] == "lora" and full.method_advice["fits"]
    assert full.method_advice["strategy"] in ("ZeRO-1", "ZeRO-2")
    lora = plan_for(llama7b, "1x-rtx4090-24g", lora=True)
    assert not lora.chosen.strategy.offloads and lora.model.trainable_params == 4_194_304
    assert lora.method_advice == {**lora.method_advice, "method": "full", "strategy": full.chosen.strategy.label}
    # the advised LoRA is the plan a --lora run gets
    assert full.method_advice["step_seconds"] == pytest.approx(lora.chosen.timing.step_seconds)


def test_lora_70b_on_two_24g_gpus_moves_the_base_off_the_gpu():
    """A 70B base does not fit two 24 GB GPUs even partitioned (138 GB of 16-bit weights): ZeRO-3 with the
    parameters offloaded is the only way, and the adapter's optimizer is negligible."""
    plan = plan_for(inspect_model("meta-llama/Llama-2-70b-hf"), "2x-rtx4090-24g", lora=True)
    assert plan.chosen.strategy.zero_stage == 3 and plan.chosen.strategy.offload_param != "none"
    assert plan.chosen.memory.gpu_bytes_per_device < 24 * 2**30


def test_lora_options_need_lora():
    with pytest.raises(UserInputError, match="--lora-rank shape a LoRA adapter: add --lora"):
        Workload(lora_rank=16)
    with pytest.raises(UserInputError, match="--lora-dropout must be below 1"):
        Workload(lora=True, lora_dropout=1.0)
