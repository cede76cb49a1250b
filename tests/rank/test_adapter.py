"""The rank side of a LoRA (launcher/rank/adapter.py) on real peft objects: the validator refuses an empty or
partitioned adapter file, the frozen-base digest sees a changed base and ignores the adapter, and the adapter is
attached in the training dtype."""

from __future__ import annotations

import json

import pytest

from launcher.rank import adapter

peft = pytest.importorskip("peft")


def tiny_lora_model(torch, rank: int = 4):
    from transformers import AutoModelForCausalLM

    from tests.helpers import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(), dtype=torch.bfloat16)
    lora = {"rank": rank, "alpha": 2.0 * rank, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}
    return adapter.attach(model, lora, "causal-lm", torch.bfloat16)


def test_attach_keeps_the_adapter_in_the_training_dtype_and_freezes_the_rest():
    import torch

    model = tiny_lora_model(torch)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert {p.dtype for p in trainable.values()} == {torch.bfloat16}  # peft alone would make them fp32
    assert sum(p.numel() for p in trainable.values()) == 2 * 2 * 4 * (64 + 64)  # 2 layers, q and v, r·(in + out)


def save(model, folder, state_dict):
    model.save_pretrained(folder, state_dict=state_dict)
    return {name: tuple(t.shape) for name, t in state_dict.items()}


def test_the_validator_refuses_an_empty_or_missing_adapter_tensor(tmp_path):
    import torch

    model = tiny_lora_model(torch)
    trained = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    expected = save(model, tmp_path / "good", trained)
    adapter.validate_adapter(tmp_path / "good", expected)  # the real export's check passes

    # what an ungathered ZeRO-3 save writes: the partitioned tensors as empty placeholders (peft issue 2892)
    name = next(iter(trained))
    empty = dict(trained, **{name: torch.empty(0, dtype=torch.bfloat16)})
    with pytest.raises(SystemExit, match=r"the exported adapter is wrong: .*lora_A.weight is \(0,\), trained"):
        adapter.validate_adapter(tmp_path / "empty", save(model, tmp_path / "empty", empty) | expected)
    partial = {key: value for key, value in trained.items() if key != name}
    save(model, tmp_path / "partial", partial)
    with pytest.raises(SystemExit, match="is None, trained"):
        adapter.validate_adapter(tmp_path / "partial", expected)
    (tmp_path / "good" / adapter.ADAPTER_CONFIG).unlink()
    with pytest.raises(SystemExit, match="no adapter_config.json"):
        adapter.validate_adapter(tmp_path / "good", expected)


def test_the_frozen_digest_sees_the_base_and_not_the_adapter():
    import torch

    model = tiny_lora_model(torch)
    before = adapter.frozen_digest(model)
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(1.0)  # the adapter trains
    assert adapter.frozen_digest(model) == before
    with torch.no_grad():
        model.get_base_model().model.norm.weight.add_(1.0)  # a frozen weight changed
    assert adapter.frozen_digest(model) != before


def test_the_adapter_config_names_the_base_and_the_lora(tmp_path):
    import torch

    model = tiny_lora_model(torch, rank=8)
    trained = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    save(model, tmp_path, trained)
    config = json.loads((tmp_path / adapter.ADAPTER_CONFIG).read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16.0 and set(config["target_modules"]) == {"q_proj", "v_proj"}
