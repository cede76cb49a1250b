"""Model inspection: exact counts on the meta device, tied weights once, clear errors for bad input."""

from __future__ import annotations

import json
import time

import pytest

from launcher.errors import UserInputError
from launcher.inspection.model import bundled_aliases, bundled_ids, inspect_model
from tests.helpers import save_config, tiny_llama_config


def llama_params(v, h, i, layers, heads, kv_heads, tied):
    """Closed form for a Llama block stack: attention q,o (h·h) + k,v (h·kv·head_dim), SwiGLU 3·h·i,
    two RMSNorms per layer, final norm, embedding, and an untied lm_head."""
    head_dim = h // heads
    per_layer = 2 * h * h + 2 * h * kv_heads * head_dim + 3 * h * i + 2 * h
    return v * h + layers * per_layer + h + (0 if tied else v * h)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_llama_exact_count_matches_closed_form(tmp_path, kv_heads):
    cfg = tiny_llama_config(num_key_value_heads=kv_heads, num_hidden_layers=3)
    profile = inspect_model(str(save_config(cfg, tmp_path / "m")))
    assert profile.params == llama_params(256, 64, 128, 3, 4, kv_heads, tied=False)
    assert profile.num_layers == 3 and profile.hidden_size == 64 and profile.vocab_size == 256
    assert profile.architecture == "LlamaForCausalLM"
    assert profile.largest_param_numel == 256 * 64  # embedding (= lm_head)
    assert profile.source == "local" and not profile.has_weights


def test_tied_weights_counted_once(tmp_path):
    untied = inspect_model(str(save_config(tiny_llama_config(), tmp_path / "untied")))
    tied = inspect_model(str(save_config(tiny_llama_config(tie_word_embeddings=True), tmp_path / "tied")))
    assert tied.tied_embeddings and not untied.tied_embeddings
    assert untied.params - tied.params == 256 * 64


def test_gpt2_tied_and_its_own_field_names(tmp_path):
    from transformers import GPT2Config

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=128)
    profile = inspect_model(str(save_config(cfg, tmp_path / "gpt2")))
    h, v, p = 64, 300, 128
    per_layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert profile.params == v * h + p * h + 2 * per_layer + 2 * h
    assert profile.tied_embeddings
    assert (profile.hidden_size, profile.num_layers, profile.max_position_embeddings) == (64, 2, 128)


def test_mixtral_fused_experts_are_the_largest_tensor(tmp_path):
    from transformers import MixtralConfig

    cfg = MixtralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
    )
    profile = inspect_model(str(save_config(cfg, tmp_path / "mixtral")))
    # transformers 5 fuses the experts: gate_up_proj is one (experts, 2·intermediate, hidden) tensor
    assert profile.largest_param_numel == 8 * 2 * 96 * 64
    assert "experts" in profile.largest_param_name
    assert profile.layer_params > 8 * 3 * 96 * 64


@pytest.mark.parametrize(
    ("config_class", "fields"),
    [
        (
            "MistralConfig",
            dict(
                vocab_size=128,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
        (
            "Qwen2Config",
            dict(
                vocab_size=128,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
    ],
)
def test_other_architectures_count_like_a_real_build(tmp_path, config_class, fields):
    import torch
    import transformers

    cfg = getattr(transformers, config_class)(**fields)
    profile = inspect_model(str(save_config(cfg, tmp_path / config_class)))
    real = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    assert profile.params == sum(p.numel() for p in real.parameters())


@pytest.mark.parametrize(
    ("model_id", "params"),
    [
        ("meta-llama/Llama-2-7b", 6_738_415_616),  # the alias of the -hf repo
        ("meta-llama/Llama-2-13b-hf", 13_015_864_320),
        ("meta-llama/Llama-2-70b-hf", 68_976_648_192),
        ("meta-llama/Meta-Llama-3-8B", 8_030_261_248),
        ("meta-llama/Meta-Llama-3-70B", 70_553_706_496),
        ("mistralai/Mistral-7B-v0.1", 7_241_732_096),
        ("mistralai/Mixtral-8x7B-v0.1", 46_702_792_704),
        ("Qwen/Qwen2.5-7B", 7_615_616_512),
        ("gpt2", 124_439_808),
    ],
)
def test_bundled_configs_count_exactly_offline(model_id, params):
    profile = inspect_model(model_id)
    assert profile.source == "bundled"
    assert profile.params == params


def test_every_bundled_config_and_alias_loads():
    ids = bundled_ids()
    assert len(ids) >= 9
    for target in bundled_aliases().values():
        assert target in ids
    for model_id in ids:
        assert inspect_model(model_id).params > 0


def test_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        inspect_model(str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(UserInputError, match="no config.json"):
        inspect_model(str(tmp_path))


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(UserInputError, match="malformed .*line 1"):
        inspect_model(str(tmp_path))


def test_unknown_architecture_suggests_trust_remote_code(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "definitely-not-a-model"}))
    with pytest.raises(UserInputError, match="--trust-remote-code"):
        inspect_model(str(tmp_path))


def test_unknown_hub_id_offline_answers_fast():
    start = time.monotonic()
    with pytest.raises(UserInputError, match="unknown model 'nobody/no-such-model'"):
        inspect_model("nobody/no-such-model")
    assert time.monotonic() - start < 5


def test_compute_params_leave_out_the_lookup_table(tmp_path):
    untied = inspect_model(str(save_config(tiny_llama_config(), tmp_path / "untied")))
    tied = inspect_model(str(save_config(tiny_llama_config(tie_word_embeddings=True), tmp_path / "tied")))
    assert untied.input_embedding_numel == 256 * 64
    assert untied.compute_params == untied.params - 256 * 64  # the lm_head still multiplies
    assert tied.compute_params == tied.params  # the shared table is the lm_head's matmul
