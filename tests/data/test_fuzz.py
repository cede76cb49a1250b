"""A fuzz test that no bytes make the data readers raise anything but UserInputError (hypothesis): random bytes,
and valid files of every format truncated, with bytes flipped or inserted, read by inspect_data and, when it
accepts them, tokenized by token_rows with a small byte-level BPE tokenizer."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from launcher.data.sources import inspect_data
from launcher.errors import UserInputError
from tests.data.corpus import DOCS, WRITERS, token_rows

TEXTS = [*DOCS, "café 東京 🙂 naïve", 'a "quoted", comma\tand tab', ""]
COLUMNS = {"text": TEXTS, "input_ids": [[2, 3, 4], [5], [], [6, 7], [8, 1], [9]]}
SUFFIXES = {"jsonl": ".jsonl", "json": ".json", "txt": ".txt", "parquet": ".parquet", "csv": ".csv"}


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained here on the test documents: any text encodes (no unknown bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TEXTS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Each format's valid data, as {relative path: bytes} (a save_to_disk folder holds three files)."""
    out = {}
    for fmt, write in WRITERS.items():
        folder = tmp_path_factory.mktemp(fmt)
        columns = {"text": TEXTS} if fmt == "txt" else dict(COLUMNS)
        if fmt == "csv":
            columns["input_ids"] = [json.dumps(ids) for ids in COLUMNS["input_ids"]]  # a cell holds "[2, 3, 4]"
        path = write(folder, columns)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        out[fmt] = {str(p.relative_to(folder)): p.read_bytes() for p in files}
    return out


@st.composite
def damaged(draw, valid: dict[str, dict[str, bytes]]) -> tuple[str, dict[str, bytes]]:
    """(format, files): random bytes under a format's suffix, or one of its valid files damaged."""
    fmt = draw(st.sampled_from(sorted(valid)))
    files = dict(valid[fmt])
    name = draw(st.sampled_from(sorted(files)))
    data = bytearray(files[name])
    how = draw(st.sampled_from(["random", "text", "truncate", "flip", "insert"]))
    if how == "random":
        data = bytearray(draw(st.binary(max_size=2048)))
    elif how == "text":  # decodes, so the parsers see it
        data = bytearray(draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=512)).encode())
    elif how == "truncate":
        del data[draw(st.integers(0, len(data))) :]
    else:
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(data) - (how == "flip")))
            if how == "flip":
                data[at] = draw(st.integers(0, 255))
            else:
                insert = [b"\0", b"\xff", b"\xc3", b'"', b"\r", b"\n", b"\\ud800", b"[" * 2000, b"9" * 5000]
                data[at:at] = draw(st.sampled_from(insert) | st.binary(min_size=1, max_size=8))
    files[name] = bytes(data)
    return fmt, files


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_in_any_format_give_one_line_or_blocks(valid, bpe_tokenizer, data):
    fmt, files = data.draw(damaged(valid))
    seq_len = data.draw(st.integers(1, 8))
    root = Path(tempfile.mkdtemp(prefix="fuzz-data-"))
    try:
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        path = root / "saved" if fmt == "arrow" else root / f"data{SUFFIXES[fmt]}"
        try:
            source = inspect_data(str(path))
            blocks = token_rows(source, bpe_tokenizer, seq_len)
        except UserInputError as err:
            message = str(err)
            assert message and "\n" not in message and "\r" not in message, message
            assert message.isprintable(), message
            problem = re.sub(r"0x[0-9a-f]{2}", "0x..", re.sub(r":\d+:", ":N:", message.replace(str(root), "")))
            event(f"{fmt}: {problem.split(';')[0][:60]}")
        else:
            assert blocks.ndim == 2 and blocks.shape[1] == seq_len
            assert blocks.min() >= 0 and blocks.max() < len(bpe_tokenizer)
            event(f"{fmt}: blocks")
    finally:
        shutil.rmtree(root)
