"""Model families through the command line (docs/planning.md "Model families"): an encoder-decoder (T5, BART) and
an encoder (BERT) are counted exactly on the meta device and planned like a causal LM, with their kind in the plan.
Offline: the bundled configs, and tiny configs made here from transformers' config classes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from tests.helpers import host_path, save_config, tiny_bart, tiny_t5


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


# (model as typed, exact parameters as Hugging Face builds it, kind, architecture, layers, cross-attention layers)
BUNDLED = [
    # T5ForConditionalGeneration: 24 + 24 blocks, the embedding shared by both stacks and the head (tied), once
    ("t5-11b", 11_307_321_344, "seq2seq-lm", "T5ForConditionalGeneration", 48, 24),
    ("facebook/bart-large", 406_291_456, "seq2seq-lm", "BartForConditionalGeneration", 24, 12),
    # AutoModel builds BertModel: no head (the pooler is counted, as BertModel has it)
    ("bert-large-uncased", 335_141_888, "other", "BertModel", 24, 0),
]


@pytest.mark.parametrize(("model", "params", "kind", "architecture", "layers", "cross"), BUNDLED)
def test_a_bundled_model_of_each_family_dry_runs_with_its_exact_count(model, params, kind, architecture, layers, cross):
    result = invoke("--model", model, "--dry-run", "--host-spec", host_path("1x-a100-80g"))
    assert result.exit_code == 0, result.output
    assert f"{params:,}" in result.output
    assert f"[{architecture}, {kind}, bundled config]" in result.output
    assert "> ZeRO-" in result.output  # a candidate was chosen

    data = json.loads(invoke("--model", model, "--dry-run", "--json", "--host-spec", host_path("1x-a100-80g")).output)
    assert data["model"]["params"] == params
    assert data["model"]["kind"] == kind
    assert data["model"]["architecture"] == architecture
    assert data["model"]["num_layers"] == layers
    assert data["model"]["cross_attention_layers"] == cross
    assert data["fits"] and data["strategy"]["label"]


def test_t5_11b_splits_its_blocks_and_counts_its_wide_attention():
    data = json.loads(
        invoke("--model", "t5-11b", "--dry-run", "--json", "--host-spec", host_path("1x-a100-80g")).output
    )
    model = data["model"]
    assert model["attention_dim"] == 128 * 128  # num_heads x d_kv, 16 x d_model
    assert model["intermediate_size"] == 65_536
    assert model["max_position_embeddings"] == 512  # n_positions: the plan's default --seq-len
    assert data["workload"]["seq_len"] == 512
    out = invoke("--model", "t5-11b", "--dry-run", "--host-spec", host_path("1x-a100-80g")).output
    assert "48 layers (24 encoder + 24 decoder)" in out


def families_t5():
    return tiny_t5(n_positions=128)


def families_bart():
    return tiny_bart(encoder_layers=2, decoder_ffn_dim=64, max_position_embeddings=128)


@pytest.mark.parametrize(
    ("config", "architecture", "blocks", "cross"),
    [(families_t5, "T5ForConditionalGeneration", 5, 3), (families_bart, "BartForConditionalGeneration", 4, 2)],
    ids=["t5", "bart"],
)
def test_a_tiny_encoder_decoder_made_here_plans_for_a_cpu_host(tmp_path, config, architecture, blocks, cross):
    import torch
    import transformers

    made = config()
    folder = save_config(made, tmp_path / "model")
    result = invoke("--model", str(folder), "--dry-run", "--json", "--host-spec", host_path("cpu-only"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    real = transformers.AutoModelForSeq2SeqLM.from_config(made, dtype=torch.float32)
    assert data["model"]["params"] == sum(p.numel() for p in real.parameters())  # counted as a real build
    assert data["model"]["architecture"] == architecture and data["model"]["kind"] == "seq2seq-lm"
    assert (data["model"]["num_layers"], data["model"]["cross_attention_layers"]) == (blocks, cross)
    assert data["fits"] and data["host"]["gpus"]["count"] == 0  # the CPU accelerator


def test_an_unknown_model_type_is_one_line_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "foo-bar"}))
    result = invoke("--model", str(tmp_path), "--dry-run", "--host-spec", host_path("cpu-only"))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    from importlib.metadata import version

    release = ".".join(version("transformers").split(".")[:2])
    assert lines[0] == (
        f"Error: {tmp_path / 'config.json'}: model_type 'foo-bar' is not one transformers {release} knows; "
        "upgrade transformers, or pass --trust-remote-code if the model ships its own code"
    )
    assert "Traceback" not in result.output
