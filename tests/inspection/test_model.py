"""Model inspection: exact counts on the meta device, tied weights once, clear errors for bad input."""

from __future__ import annotations

import json
import time

import pytest

from launcher.errors import UserInputError
from launcher.inspection.model import inspect_model
from launcher.inspection.model_config import bundled_aliases, bundled_ids
from tests.helpers import save_config, tiny_bart, tiny_bert, tiny_llama_config, tiny_t5


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
        ("t5-11b", 11_307_321_344),  # the alias of google-t5/t5-11b: T5ForConditionalGeneration, tied
        ("facebook/bart-large", 406_291_456),  # BartForConditionalGeneration
        ("bert-large-uncased", 335_141_888),  # the alias of google-bert/bert-large-uncased: BertModel
    ],
)
def test_bundled_configs_count_exactly_offline(model_id, params):
    profile = inspect_model(model_id)
    assert profile.source == "bundled"
    assert profile.params == params


def test_t5_11b_counts_both_stacks_and_its_largest_block():
    t5 = inspect_model("t5-11b")
    assert (t5.kind, t5.architecture, t5.name) == ("seq2seq-lm", "T5ForConditionalGeneration", "google-t5/t5-11b")
    assert (t5.num_layers, t5.cross_attention_layers, t5.encoder_layers) == (48, 24, 24)
    assert t5.tied_embeddings and t5.compute_params == t5.params  # the shared table is the head's matmul
    # the largest block is the decoder's first: self-attention and cross-attention (4 x 1024 x 16,384 each), the
    # relative position bias (32 buckets x 128 heads), the 1024 x 65,536 MLP (wi, wo), three RMSNorms
    inner = 128 * 128
    assert t5.layer_params == 2 * 4 * 1024 * inner + 32 * 128 + 2 * 1024 * 65_536 + 3 * 1024
    assert t5.largest_param_numel == 1024 * 65_536 and t5.largest_param_name.endswith("DenseReluDense.wi.weight")
    assert t5.attention_dim == inner and t5.hidden_size == 1024
    assert len(t5.param_numels) == 509 and sum(t5.param_numels) == t5.params  # model.parameters() order


@pytest.mark.parametrize(
    ("make", "auto_class", "kind", "blocks", "cross"),
    [
        (tiny_t5, "AutoModelForSeq2SeqLM", "seq2seq-lm", 5, 3),
        (tiny_bart, "AutoModelForSeq2SeqLM", "seq2seq-lm", 5, 2),
        (tiny_bert, "AutoModel", "other", 2, 0),
        (lambda: tiny_bert(is_decoder=True), "AutoModelForCausalLM", "causal-lm", 2, 0),  # BertLMHeadModel
        (tiny_llama_config, "AutoModelForCausalLM", "causal-lm", 2, 0),
    ],
    ids=["t5", "bart", "bert", "bert-decoder", "llama"],
)
def test_each_kind_counts_as_its_auto_class_builds_it(tmp_path, make, auto_class, kind, blocks, cross):
    import torch
    import transformers

    config = make()
    profile = inspect_model(str(save_config(config, tmp_path / "m")))
    real = getattr(transformers, auto_class).from_config(config, dtype=torch.float32)
    assert profile.kind == kind and profile.architecture == type(real).__name__
    assert profile.params == sum(p.numel() for p in real.parameters())
    assert profile.param_numels == tuple(p.numel() for p in real.parameters())
    assert (profile.num_layers, profile.cross_attention_layers) == (blocks, cross)
    assert profile.to_json()["kind"] == kind


def test_encoder_decoder_blocks_are_told_apart_by_stack(tmp_path):
    """T5 names both stacks' blocks encoder.block.N / decoder.block.N: block 0 of each is its own block, and the
    largest is a decoder block (self-attention, cross-attention and the MLP)."""
    t5 = inspect_model(str(save_config(tiny_t5(), tmp_path / "t5")))
    h, inner, ff = 32, 4 * 8, 64
    decoder_first = 2 * 4 * h * inner + 32 * 4 + 2 * h * ff + 3 * h  # with the relative attention bias
    assert t5.layer_params == decoder_first
    assert t5.attention_dim == inner == t5.hidden_size  # 4 heads x 8 = d_model: no separate width
    assert t5.attention_width == 0


def test_cut_to_layers_cuts_both_stacks_of_an_encoder_decoder():
    from launcher.inspection.model_config import cut_to_layers

    t5, bart = tiny_t5(num_layers=4, num_decoder_layers=4), tiny_bart()
    cut_to_layers(t5, 1)
    cut_to_layers(bart, 1)
    assert (t5.num_layers, t5.num_decoder_layers) == (1, 1)
    assert (bart.encoder_layers, bart.decoder_layers) == (1, 1)


def test_unknown_model_type_is_one_line_naming_it_and_the_transformers_release(tmp_path):
    from importlib.metadata import version

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "foo-bar"}))
    with pytest.raises(UserInputError) as caught:
        inspect_model(str(tmp_path))
    message = str(caught.value)
    release = ".".join(version("transformers").split(".")[:2])
    assert message == (
        f"{tmp_path / 'config.json'}: model_type 'foo-bar' is not one transformers {release} knows; upgrade "
        "transformers, or pass --trust-remote-code if the model ships its own code"
    )
    assert "\n" not in message and len(message) < 300


def test_a_type_no_auto_class_builds_is_one_line_without_the_auto_class_list(tmp_path, monkeypatch):
    """What AutoModel says of a config it has no class for lists every type it knows (hundreds of names): the
    message names the type and the auto class only."""
    from launcher.inspection import model as model_module

    monkeypatch.setattr(model_module, "model_kind", lambda config, trust_remote_code=False: "other")
    config = tiny_llama_config()
    config.model_type = "llama"
    monkeypatch.setattr(
        model_module,
        "auto_class",
        lambda kind: type("AutoModel", (), {"from_config": staticmethod(_refuses)}),
    )
    with pytest.raises(UserInputError) as caught:
        inspect_model(str(save_config(config, tmp_path / "m")))
    message = str(caught.value)
    assert "model_type 'llama'" in message and "AutoModel" in message and "--trust-remote-code" in message
    assert "should be one of" not in message and "\n" not in message


def _refuses(config, **_kwargs):
    raise ValueError(
        "Unrecognized configuration class for this kind of AutoModel: AutoModel.\nModel type should be one of "
        + ", ".join(f"Type{i}Config" for i in range(500))
    )


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
