"""Helpers shared by the tests (imported as `tests.helpers`; fixtures live in conftest.py). Everything here is
offline: models come from transformers config classes, hardware from the bundled host descriptions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOSTS = REPO / "recipes" / "hosts"


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    fields = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def save_config(config, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    return directory


def host_path(name: str) -> str:
    return str(HOSTS / f"{name}.yaml")


def offload_launch(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m launcher ARGS` in `cwd`, offline, as a user runs it (this checkout's package first)."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO)),
    )


def only(findings, path):
    """The findings at `path`; exactly one, so a check and the schema never report the same thing twice."""
    at = [f for f in findings if f.path == path]
    assert len(at) == 1, [str(f) for f in findings]
    return at[0]


def errors(findings):
    return [str(f) for f in findings if f.level == "error"]


# Tiny encoder-decoder and encoder configs (inspection and CLI tests): as Hugging Face builds T5, BART, BERT.
def tiny_t5(**overrides):
    from transformers import T5Config

    fields = dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4)
    return T5Config(**(fields | overrides))


def tiny_bart(**overrides):
    from transformers import BartConfig

    fields = dict(
        vocab_size=128,
        d_model=32,
        encoder_layers=3,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
    )
    return BartConfig(**(fields | overrides))


def tiny_bert(**overrides):
    from transformers import BertConfig

    fields = dict(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertConfig(**(fields | overrides))
