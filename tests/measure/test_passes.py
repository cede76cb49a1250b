"""The passes measured at the model's shapes (launcher/measure/passes.py, run and cached by job/measuring.py): real
forward and backward passes of the tiny model cut to one and three blocks on this CPU, cached, and skipped when they
would take too long."""

from __future__ import annotations

import pytest

from launcher.inspection.model import inspect_model
from launcher.job import measuring
from launcher.measure import cache
from launcher.plan.workload import Workload
from tests.helpers import save_config, tiny_llama_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    config = tiny_llama_config(num_hidden_layers=4, hidden_size=128, intermediate_size=256)
    return inspect_model(str(save_config(config, tmp_path_factory.mktemp("tiny") / "model")))


def measure(profile, cache_dir, said, micro_batch=2, seq_len=32, **overrides):
    workload = Workload(micro_batch=micro_batch, seq_len=seq_len, activation_checkpointing=False)
    arguments = dict(device="cpu", threads=1, flops_per_s=1e11, host_id="test-host", cache_dir=cache_dir)
    return measuring.measure_passes(profile, workload, log=said.append, **(arguments | overrides))


def test_a_block_costs_what_the_two_cuts_differ_by_and_the_result_is_cached(tiny, tmp_path):
    said: list[str] = []
    first = measure(tiny, tmp_path, said)
    assert len(said) == 1 and "measuring the passes at the model's shapes (2 x 32 tokens, 1 threads)" in said[0]
    assert first["cut_layers"] == [1, 3]
    one, three = first["cut_seconds"]
    # two blocks apart; on a busy machine the difference of two best-of-5 times may be noise, never negative
    assert first["per_layer_seconds"] == pytest.approx(max(0.0, (three - one) / 2))
    assert first["fixed_seconds"] == pytest.approx(max(0.0, one - first["per_layer_seconds"]))
    assert first["tokens"] == 64
    said.clear()
    assert measure(tiny, tmp_path, said) == first and said == []  # from the cache: nothing measured again
    assert measure(tiny, tmp_path, said, seq_len=16) != first  # another shape is another key


def test_a_model_shallower_than_the_cuts_is_cut_to_its_own_depth(tmp_path):
    said: list[str] = []
    two = inspect_model(str(save_config(tiny_llama_config(num_hidden_layers=2), tmp_path / "two")))
    assert measure(two, tmp_path, said)["cut_layers"] == [1, 2]


def test_a_one_block_model_cannot_tell_a_block_from_the_rest(tmp_path):
    said: list[str] = []
    one = inspect_model(str(save_config(tiny_llama_config(num_hidden_layers=1), tmp_path / "one")))
    assert measure(one, tmp_path, said) is None and said == []


def test_the_cache_is_keyed_by_everything_the_passes_depend_on(tiny, tmp_path):
    workload = Workload(micro_batch=2, seq_len=32, activation_checkpointing=False)
    key = measuring.passes_key(tiny, workload, device="cpu", threads=1, host_id="h")
    assert cache.load_passes(tmp_path, key) is None  # nothing measured: a plan reads no passes
    for other in (
        measuring.passes_key(tiny, workload, device="cpu", threads=2, host_id="h"),
        measuring.passes_key(tiny, workload, device="cuda", threads=1, host_id="h"),
        measuring.passes_key(tiny, workload, device="cpu", threads=1, host_id="another"),
        measuring.passes_key(tiny, Workload(micro_batch=2, seq_len=32), device="cpu", threads=1, host_id="h"),
    ):
        assert other != key


def test_cuts_that_would_take_too_long_are_not_built(tmp_path):
    """Llama-2-7B at 4 x 2048 tokens on a 100 GFLOP/s CPU: minutes per pass; the plan counts FLOPs instead."""
    said: list[str] = []
    llama = inspect_model("meta-llama/Llama-2-7b")
    assert measure(llama, tmp_path, said, micro_batch=4, seq_len=2048) is None
    assert said == []


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_an_encoder_decoder_is_cut_in_both_stacks_and_timed_on_source_and_target(tmp_path, family):
    """Cut to 1 and 3 blocks per stack: 2 and 6 blocks, so a block is the mean of an encoder and a decoder block."""
    from transformers import BartConfig, T5Config

    config = (
        T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=4, num_heads=4, decoder_start_token_id=0)
        if family == "t5"
        else BartConfig(
            vocab_size=128,
            d_model=64,
            encoder_layers=4,
            decoder_layers=4,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
        )
    )
    profile = inspect_model(str(save_config(config, tmp_path / family)))
    assert profile.kind == "seq2seq-lm" and profile.cross_attention_layers == 4
    said: list[str] = []
    result = measure(profile, tmp_path, said)
    assert result is not None, said
    assert result["cut_layers"] == [1, 3] and result["cut_blocks"] == [2, 6]
    one, three = result["cut_seconds"]
    assert result["per_layer_seconds"] == pytest.approx(max(0.0, (three - one) / 4))
    assert result["fixed_seconds"] == pytest.approx(max(0.0, one - 2 * result["per_layer_seconds"]))


def test_a_model_of_kind_other_is_not_timed(tmp_path):
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128
    )
    bert = inspect_model(str(save_config(config, tmp_path / "bert")))
    said: list[str] = []
    assert bert.kind == "other"
    assert measure(bert, tmp_path, said) is None and said == []
