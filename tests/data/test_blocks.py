"""launcher/data/blocks.py: EOS-separated packing into fixed-length blocks, pre-tokenized records, the token
cache, and each user error in tokenizing."""

from __future__ import annotations

import os

import numpy as np
import pytest

from launcher.data.blocks import cache_key
from launcher.data.rows import Tokenization
from launcher.data.sources import inspect_data
from launcher.errors import UserInputError
from tests.data.corpus import (
    DOCS,
    EOS,
    VOCAB,
    ids,
    make_tokenizer,
    one_line_error,
    stream,
    token_rows,
    write_arrow,
    write_jsonl,
    write_parquet,
)

# ------------------------------------------------------------------------------------------ layout


def test_two_documents_exact_layout_and_tail_dropped(tmp_path, tokenizer):
    source = inspect_data(str(write_jsonl(tmp_path, {"text": ["zero one two", "three four"]})))
    a, b, c, d, e = ids("zero one two three four")
    assert token_rows(source, tokenizer, seq_len=7).tolist() == [[a, b, c, EOS, d, e, EOS]]
    assert token_rows(source, tokenizer, seq_len=3).tolist() == [[a, b, c], [EOS, d, e]]  # last EOS dropped
    assert token_rows(source, tokenizer, seq_len=4).shape == (1, 4)
    assert token_rows(source, tokenizer, seq_len=1).shape == (7, 1)


# ------------------------------------------------------------------------------------------ input_ids


def test_records_with_input_ids_are_used_as_they_are(tmp_path, tokenizer):
    pre = [[2, 3, 4], [5, EOS], [6]]  # the second already ends with EOS: not doubled
    path = write_jsonl(tmp_path, {"text": ["ignored text", "ignored", "ignored"], "input_ids": pre})
    source = inspect_data(str(path))
    assert source.has_input_ids
    assert token_rows(source, tokenizer, seq_len=7).tolist() == [[2, 3, 4, EOS, 5, EOS, 6]]
    assert "ignored text" not in tokenizer.__dict__.get("texts_seen", [])


def test_input_ids_without_text_field_and_mixed_with_text(tmp_path, tokenizer):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"input_ids": [2, 3]}\n{"text": "four five"}\n')
    source = inspect_data(str(path))  # no 'text' in the first record, but input_ids is enough
    assert token_rows(source, tokenizer, seq_len=6).tolist() == [[2, 3, EOS, *ids("four five"), EOS]]


def test_input_ids_in_arrow_and_parquet(tmp_path, tokenizer):
    columns = {"input_ids": [[2, 3, 4], [5, 6]]}
    for path in (write_arrow(tmp_path, columns), write_parquet(tmp_path, columns)):
        assert token_rows(inspect_data(str(path)), tokenizer, seq_len=7).tolist() == [[2, 3, 4, EOS, 5, 6, EOS]]


def test_input_ids_outside_the_vocabulary(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"input_ids": [[2, 3], [4, 50000]]})
    with pytest.raises(UserInputError) as err:
        token_rows(inspect_data(str(path)), tokenizer, seq_len=2)
    assert str(err.value) == (
        f"{path}:2: input_ids holds token id 50000, outside the tokenizer's {len(VOCAB)} tokens; "
        f"tokenize with this model's tokenizer, or drop input_ids and keep the text"
    )


# ------------------------------------------------------------------------------------------ cache


def test_second_call_loads_the_cache_without_tokenizing(tmp_path):
    source = inspect_data(str(write_jsonl(tmp_path, {"text": DOCS})))
    cache = tmp_path / "cache"
    first_tokenizer, second_tokenizer = make_tokenizer(), make_tokenizer()
    first = token_rows(source, first_tokenizer, seq_len=5, cache_dir=cache)
    assert set(DOCS) <= set(first_tokenizer.texts_seen)
    second = token_rows(source, second_tokenizer, seq_len=5, cache_dir=cache)
    assert not set(DOCS) & set(second_tokenizer.texts_seen)  # only the short probe strings of the cache key
    assert second.tolist() == first.tolist()
    assert second.dtype == np.int64
    assert [p.name for p in cache.iterdir()] == [
        f"{cache_key(source, second_tokenizer, Tokenization(5))}.npz"
    ]  # no temp files


def test_cache_key_changes_with_seq_len_field_data_and_tokenizer(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    source = inspect_data(str(path))
    key = cache_key(source, tokenizer, Tokenization(5))
    assert key == cache_key(inspect_data(str(path)), make_tokenizer(), Tokenization(5))
    assert cache_key(source, tokenizer, Tokenization(4)) != key
    assert cache_key(source, tokenizer, Tokenization(5, text_field="body")) != key
    renamed = {("Hello" if word == "adam" else word): i for word, i in VOCAB.items()}  # same size and name
    assert (
        cache_key(source, make_tokenizer(renamed), Tokenization(5)) != key
    )  # but it encodes the probe strings differently
    os.utime(path, ns=(1, 1))
    assert cache_key(inspect_data(str(path)), tokenizer, Tokenization(5)) != key

    cache = tmp_path / "cache"
    token_rows(source, tokenizer, seq_len=5, cache_dir=cache)
    token_rows(source, tokenizer, seq_len=3, cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 2


def test_changed_data_or_corrupt_cache_is_rebuilt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    cache = tmp_path / "cache"
    token_rows(inspect_data(str(path)), tokenizer, seq_len=5, cache_dir=cache)
    write_jsonl(tmp_path, {"text": ["adam gpu cpu nvme"]})
    source = inspect_data(str(path))
    assert token_rows(source, tokenizer, seq_len=5, cache_dir=cache).tolist() == [stream(["adam gpu cpu nvme"])]
    cached = cache / f"{cache_key(source, tokenizer, Tokenization(5))}.npz"
    cached.write_bytes(b"not a numpy file")
    assert token_rows(source, tokenizer, seq_len=5, cache_dir=cache).tolist() == [stream(["adam gpu cpu nvme"])]
    assert np.load(cached)["input_ids"].tolist() == [stream(["adam gpu cpu nvme"])]


# ------------------------------------------------------------------------------------------ user errors


def test_too_little_data_for_one_block(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    assert one_line_error(token_rows, inspect_data(str(path)), tokenizer, 100) == (
        f"data in {path} yields 15 tokens, fewer than one --seq-len block of 100; add data or lower --seq-len"
    )


def test_bad_records_and_tokenizer_without_eos(tmp_path, tokenizer):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "zero"}\n{"text": \n')
    assert one_line_error(inspect_data, str(bad_json)).startswith(f"{bad_json}:2: invalid JSON")
    number = write_jsonl(tmp_path, {"text": ["zero", 7]}, name="number.jsonl")
    message = one_line_error(token_rows, inspect_data(str(number)), tokenizer, 1)
    assert message.startswith(f"{number}:2: 'text' holds a int, not text")
    good = inspect_data(str(write_jsonl(tmp_path, {"text": DOCS})))
    assert "has no eos_token" in one_line_error(token_rows, good, make_tokenizer(eos=None), 5)
    assert "no 'body' field" in one_line_error(token_rows, good, tokenizer, 5, text_field="body")
    assert "--seq-len must be at least 1, got 0" in one_line_error(token_rows, good, tokenizer, 0)
