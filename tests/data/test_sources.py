"""launcher/data.py: every input format, EOS-separated packing, the token cache, each user error, and the
distributed block order. The tokenizer is a word-level one built here, so every expected id is known."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from launcher.data.sampling import BlockOrder
from launcher.data.sources import cache_key, inspect_data, load_token_blocks
from launcher.errors import UserInputError
from tests.helpers import REPO

WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "gpu",
    "cpu",
    "nvme",
    "adam",
]
VOCAB = {"[UNK]": 0, "</s>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
EOS = VOCAB["</s>"]
DOCS = ["zero one two three", "four five", "six seven eight nine ten gpu"]  # 4 + 2 + 6 tokens, 3 EOS: 15 in all
DEMO = REPO / "launcher" / "demo"


def ids(text: str) -> list[int]:
    return [VOCAB[word] for word in text.split()]


def stream(docs: list[str]) -> list[int]:
    return [token for doc in docs for token in [*ids(doc), EOS]]


class CountingTokenizer(PreTrainedTokenizerFast):
    """Records every text it is asked to encode, to prove a cache hit tokenizes no document."""

    def __call__(self, text, *args, **kwargs):
        self.__dict__.setdefault("texts_seen", []).extend([text] if isinstance(text, str) else list(text))
        return super().__call__(text, *args, **kwargs)


def make_tokenizer(vocab: dict[str, int] = VOCAB, eos: str | None = "</s>", cls=CountingTokenizer):
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    kwargs = {"eos_token": eos} if eos else {}
    return cls(tokenizer_object=backend, unk_token="[UNK]", **kwargs)


@pytest.fixture
def tokenizer():
    return make_tokenizer()


# ------------------------------------------------------------------------------------------ writers


def write_arrow(directory: Path, columns: dict) -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(columns).save_to_disk(str(directory / "saved"))
    return directory / "saved"


def write_jsonl(directory: Path, columns: dict, name: str = "data.jsonl") -> Path:
    path = directory / name
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_json(directory: Path, columns: dict) -> Path:
    path = directory / "data.json"
    path.write_text(json.dumps([dict(zip(columns, v, strict=True)) for v in zip(*columns.values(), strict=True)]))
    return path


def write_txt(directory: Path, columns: dict) -> Path:
    path = directory / "data.txt"
    path.write_text("\n\n".join(columns["text"]) + "\n")  # blank lines between documents are skipped
    return path


def write_parquet(directory: Path, columns: dict) -> Path:
    import pyarrow
    import pyarrow.parquet

    path = directory / "data.parquet"
    pyarrow.parquet.write_table(pyarrow.table(columns), path)
    return path


def write_csv(directory: Path, columns: dict) -> Path:
    path = directory / "data.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
    return path


WRITERS = {
    "arrow": write_arrow,
    "jsonl": write_jsonl,
    "json": write_json,
    "txt": write_txt,
    "parquet": write_parquet,
    "csv": write_csv,
}


# ------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_every_format_packs_the_same_eos_separated_stream(fmt, tmp_path, tokenizer):
    path = WRITERS[fmt](tmp_path, {"text": DOCS})
    source = inspect_data(str(path))
    assert source.format == fmt
    assert source.fields == ("text",)
    assert not source.has_input_ids
    assert source.files == (() if fmt == "arrow" else (str(path),))
    blocks = load_token_blocks(source, tokenizer, seq_len=5)
    assert blocks.dtype == np.int64
    assert blocks.tolist() == np.array(stream(DOCS)).reshape(3, 5).tolist()


@pytest.mark.parametrize("fmt", ["arrow", "jsonl", "json", "parquet", "csv"])
def test_text_field_other_than_text(fmt, tmp_path, tokenizer):
    path = WRITERS[fmt](tmp_path, {"id": ["a", "b", "c"], "body": DOCS})
    with pytest.raises(UserInputError, match="no 'text' field"):
        inspect_data(str(path))
    source = inspect_data(str(path), text_field="body")
    assert source.fields == ("id", "body")
    assert load_token_blocks(source, tokenizer, seq_len=15, text_field="body").tolist() == [stream(DOCS)]


def test_two_documents_exact_layout_and_tail_dropped(tmp_path, tokenizer):
    source = inspect_data(str(write_jsonl(tmp_path, {"text": ["zero one two", "three four"]})))
    a, b, c, d, e = ids("zero one two three four")
    assert load_token_blocks(source, tokenizer, seq_len=7).tolist() == [[a, b, c, EOS, d, e, EOS]]
    assert load_token_blocks(source, tokenizer, seq_len=3).tolist() == [[a, b, c], [EOS, d, e]]  # last EOS dropped
    assert load_token_blocks(source, tokenizer, seq_len=4).shape == (1, 4)
    assert load_token_blocks(source, tokenizer, seq_len=1).shape == (7, 1)


def test_json_variants_dict_of_columns_and_json_lines(tmp_path, tokenizer):
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps({"text": DOCS}))
    lines = tmp_path / "lines" / "data.json"
    lines.parent.mkdir()
    lines.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    for path in (columns, lines):
        assert load_token_blocks(inspect_data(str(path)), tokenizer, seq_len=15).tolist() == [stream(DOCS)]
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"text": DOCS[0], "id": 1}))
    assert load_token_blocks(inspect_data(str(single)), tokenizer, seq_len=5).tolist() == [stream(DOCS[:1])]
    scalars = tmp_path / "scalars.json"
    scalars.write_text(json.dumps(DOCS))
    assert "expected a list of JSON objects, a dict of columns, or JSON Lines" in one_line_error(
        inspect_data, str(scalars)
    )


def test_dataset_dict_uses_train_split_or_the_only_split(tmp_path, tokenizer):
    import datasets

    datasets.disable_progress_bars()
    train, other = datasets.Dataset.from_dict({"text": DOCS}), datasets.Dataset.from_dict({"text": ["adam"] * 20})
    datasets.DatasetDict({"test": other, "train": train}).save_to_disk(str(tmp_path / "both"))
    datasets.DatasetDict({"validation": train}).save_to_disk(str(tmp_path / "only"))
    datasets.DatasetDict({"a": train, "b": other}).save_to_disk(str(tmp_path / "neither"))
    for name in ("both", "only"):
        source = inspect_data(str(tmp_path / name))
        assert source.format == "arrow"
        assert load_token_blocks(source, tokenizer, seq_len=15).tolist() == [stream(DOCS)]
    with pytest.raises(UserInputError, match="holds splits a, b and none is 'train'"):
        inspect_data(str(tmp_path / "neither"))


def test_folder_is_read_recursively_in_sorted_order_skipping_other_files(tmp_path, tokenizer):
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub", {"text": DOCS[2:]}, name="b.jsonl")
    write_jsonl(tmp_path, {"text": DOCS[:2]}, name="a.jsonl")
    (tmp_path / "README.md").write_text("# not data")
    (tmp_path / ".hidden.jsonl").write_text('{"text": "adam adam"}\n')
    source = inspect_data(str(tmp_path))
    assert source.files == (str(tmp_path / "a.jsonl"), str(tmp_path / "sub" / "b.jsonl"))
    assert load_token_blocks(source, tokenizer, seq_len=15).tolist() == [stream(DOCS)]


# ----------------------------------------------------------------------------------------- input_ids


def test_records_with_input_ids_are_used_as_they_are(tmp_path, tokenizer):
    pre = [[2, 3, 4], [5, EOS], [6]]  # the second already ends with EOS: not doubled
    path = write_jsonl(tmp_path, {"text": ["ignored text", "ignored", "ignored"], "input_ids": pre})
    source = inspect_data(str(path))
    assert source.has_input_ids
    assert load_token_blocks(source, tokenizer, seq_len=7).tolist() == [[2, 3, 4, EOS, 5, EOS, 6]]
    assert "ignored text" not in tokenizer.__dict__.get("texts_seen", [])


def test_input_ids_without_text_field_and_mixed_with_text(tmp_path, tokenizer):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"input_ids": [2, 3]}\n{"text": "four five"}\n')
    source = inspect_data(str(path))  # no 'text' in the first record, but input_ids is enough
    assert load_token_blocks(source, tokenizer, seq_len=6).tolist() == [[2, 3, EOS, *ids("four five"), EOS]]


def test_input_ids_in_arrow_and_parquet(tmp_path, tokenizer):
    columns = {"input_ids": [[2, 3, 4], [5, 6]]}
    for path in (write_arrow(tmp_path, columns), write_parquet(tmp_path, columns)):
        assert load_token_blocks(inspect_data(str(path)), tokenizer, seq_len=7).tolist() == [[2, 3, 4, EOS, 5, 6, EOS]]


def test_input_ids_outside_the_vocabulary(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"input_ids": [[2, 3], [4, 50000]]})
    with pytest.raises(UserInputError) as err:
        load_token_blocks(inspect_data(str(path)), tokenizer, seq_len=2)
    assert str(err.value) == (
        f"{path}:2: input_ids holds token id 50000, outside the tokenizer's {len(VOCAB)} tokens; "
        f"tokenize with this model's tokenizer, or drop input_ids and keep the text"
    )


# ------------------------------------------------------------------------------------------------ cache


def test_second_call_loads_the_cache_without_tokenizing(tmp_path):
    source = inspect_data(str(write_jsonl(tmp_path, {"text": DOCS})))
    cache = tmp_path / "cache"
    first_tokenizer, second_tokenizer = make_tokenizer(), make_tokenizer()
    first = load_token_blocks(source, first_tokenizer, seq_len=5, cache_dir=cache)
    assert set(DOCS) <= set(first_tokenizer.texts_seen)
    second = load_token_blocks(source, second_tokenizer, seq_len=5, cache_dir=cache)
    assert not set(DOCS) & set(second_tokenizer.texts_seen)  # only the short probe strings of the cache key
    assert second.tolist() == first.tolist()
    assert second.dtype == np.int64
    assert [p.name for p in cache.iterdir()] == [f"{cache_key(source, second_tokenizer, 5)}.npy"]  # no temp files


def test_cache_key_changes_with_seq_len_field_data_and_tokenizer(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    source = inspect_data(str(path))
    key = cache_key(source, tokenizer, 5)
    assert key == cache_key(inspect_data(str(path)), make_tokenizer(), 5)
    assert cache_key(source, tokenizer, 4) != key
    assert cache_key(source, tokenizer, 5, text_field="body") != key
    renamed = {("Hello" if word == "adam" else word): i for word, i in VOCAB.items()}  # same size and name
    assert cache_key(source, make_tokenizer(renamed), 5) != key  # but it encodes the probe strings differently
    os.utime(path, ns=(1, 1))
    assert cache_key(inspect_data(str(path)), tokenizer, 5) != key

    cache = tmp_path / "cache"
    load_token_blocks(source, tokenizer, seq_len=5, cache_dir=cache)
    load_token_blocks(source, tokenizer, seq_len=3, cache_dir=cache)
    assert len(list(cache.glob("*.npy"))) == 2


def test_changed_data_or_corrupt_cache_is_rebuilt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    cache = tmp_path / "cache"
    load_token_blocks(inspect_data(str(path)), tokenizer, seq_len=5, cache_dir=cache)
    write_jsonl(tmp_path, {"text": ["adam gpu cpu nvme"]})
    source = inspect_data(str(path))
    assert load_token_blocks(source, tokenizer, seq_len=5, cache_dir=cache).tolist() == [stream(["adam gpu cpu nvme"])]
    cached = cache / f"{cache_key(source, tokenizer, 5)}.npy"
    cached.write_bytes(b"not a numpy file")
    assert load_token_blocks(source, tokenizer, seq_len=5, cache_dir=cache).tolist() == [stream(["adam gpu cpu nvme"])]
    assert np.load(cached).tolist() == [stream(["adam gpu cpu nvme"])]


# ------------------------------------------------------------------------------------------ user errors


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(UserInputError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_inspect_errors_each_say_what_and_what_to_do(tmp_path):
    assert "does not exist; pass a datasets save_to_disk folder" in one_line_error(inspect_data, str(tmp_path / "no"))
    (tmp_path / "empty").mkdir()
    assert one_line_error(inspect_data, str(tmp_path / "empty")).startswith(
        f"data folder {tmp_path / 'empty'} is empty"
    )
    (tmp_path / "zero.jsonl").write_text("")
    assert "is empty" in one_line_error(inspect_data, str(tmp_path / "zero.jsonl"))
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "is empty (no records" in one_line_error(inspect_data, str(tmp_path / "blank.jsonl"))
    (tmp_path / "data.xml").write_text("<text/>")
    message = one_line_error(inspect_data, str(tmp_path / "data.xml"))
    assert message.startswith("unsupported data format '.xml'") and ".jsonl, .json, .txt, .parquet or .csv" in message
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("hi")
    assert "no supported data files in" in one_line_error(inspect_data, str(tmp_path / "docs"))
    (tmp_path / "mixed").mkdir()
    write_jsonl(tmp_path / "mixed", {"text": DOCS})
    write_csv(tmp_path / "mixed", {"text": DOCS})
    assert "mixes formats (.csv, .jsonl); keep one format per folder" in one_line_error(
        inspect_data, str(tmp_path / "mixed")
    )


def test_missing_text_field_names_the_fields_and_the_flag(tmp_path):
    path = write_jsonl(tmp_path, {"title": ["a"], "body": ["b"]})
    assert one_line_error(inspect_data, str(path)) == (
        f"no 'text' field (and no 'input_ids') in {path}; its fields are title, body; "
        f"pass --text-field with the one holding the text"
    )


def test_too_little_data_for_one_block(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    assert one_line_error(load_token_blocks, inspect_data(str(path)), tokenizer, 100) == (
        f"data in {path} yields 15 tokens, fewer than one --seq-len block of 100; add data or lower --seq-len"
    )


def test_bad_records_and_tokenizer_without_eos(tmp_path, tokenizer):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "zero"}\n{"text": \n')
    assert one_line_error(inspect_data, str(bad_json)).startswith(f"{bad_json}:2: invalid JSON")
    number = write_jsonl(tmp_path, {"text": ["zero", 7]}, name="number.jsonl")
    message = one_line_error(load_token_blocks, inspect_data(str(number)), tokenizer, 1)
    assert message.startswith(f"{number}:2: 'text' holds a int, not text")
    good = inspect_data(str(write_jsonl(tmp_path, {"text": DOCS})))
    assert "has no eos_token" in one_line_error(load_token_blocks, good, make_tokenizer(eos=None), 5)
    assert "no 'body' field" in one_line_error(load_token_blocks, good, tokenizer, 5, text_field="body")
    assert "--seq-len must be at least 1, got 0" in one_line_error(load_token_blocks, good, tokenizer, 0)


# ------------------------------------------------------------------------------------------ block order


def test_ranks_are_disjoint_and_cover_every_block_each_epoch():
    world, micro, n_blocks = 3, 2, 12
    orders = [BlockOrder(n_blocks, world, rank, seed=7, micro_batch=micro) for rank in range(world)]
    assert orders[0].micro_steps_per_epoch == 2
    for epoch in range(3):
        steps = range(epoch * 2, epoch * 2 + 2)
        seen = [index for order in orders for step in steps for index in order.batch(step)]
        assert sorted(seen) == list(range(n_blocks))
        assert all(order.epoch(steps[0]) == epoch for order in orders)


def test_leftover_blocks_are_dropped_per_epoch_without_overlap():
    orders = [BlockOrder(10, 3, rank, seed=1) for rank in range(3)]  # 3 blocks per rank, 1 left over
    for epoch in range(4):
        seen = [i for order in orders for step in range(epoch * 3, epoch * 3 + 3) for i in order.batch(step)]
        assert len(set(seen)) == 9


def test_order_is_deterministic_resumable_and_seeded():
    order = BlockOrder(50, 2, 1, seed=3)
    forward = [order.batch(step, 4) for step in range(40)]
    fresh = BlockOrder(50, 2, 1, seed=3)  # a resumed run: asks for late steps first
    assert [fresh.batch(step, 4) for step in reversed(range(40))] == forward[::-1]
    assert [BlockOrder(50, 2, 1, seed=4).batch(step, 4) for step in range(40)] != forward
    assert BlockOrder(50, 2, 0, seed=3).permutation(0).tolist() != list(range(50))  # actually shuffled


def test_epoch_rollover_is_seamless():
    order = BlockOrder(10, 1, 0, seed=0, micro_batch=4)
    first, second = order.permutation(0).tolist(), order.permutation(1).tolist()
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert order.batch(0) + order.batch(1) == first[:8]
    assert order.batch(2) == first[8:] + second[:2]
    assert order.micro_steps_per_epoch == 2
    assert BlockOrder(1, 1, 0, seed=0, micro_batch=4).micro_steps_per_epoch == 1


def test_order_is_pinned_so_resume_survives_library_upgrades():
    # splitmix64-keyed, not numpy's or torch's RNG: this list must never change (a resumed run depends on it)
    assert BlockOrder(8, 1, 0, seed=0).permutation(0).tolist() == [0, 7, 3, 1, 5, 4, 6, 2]


def test_fewer_blocks_than_ranks():
    assert "yields 2 blocks, fewer than the 4 ranks" in one_line_error(BlockOrder, 2, 4, 0, 0)


# ------------------------------------------------------------------------------------------ demo assets


def test_demo_assets_load_and_pack():
    from transformers import AutoConfig, AutoTokenizer

    from launcher.inspection.model import inspect_model

    sizes = {p.relative_to(DEMO).as_posix(): p.stat().st_size for p in DEMO.rglob("*") if p.is_file()}
    assert 150_000 <= sizes["data/train.jsonl"] <= 300_000 and sum(sizes.values()) <= 400_000
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "tiny-llama")
    assert AutoConfig.from_pretrained(DEMO / "tiny-llama").vocab_size == len(tokenizer) == 891
    specials = (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token, tokenizer.pad_token)
    assert specials == ("<s>", "</s>", "<unk>", "<pad>")
    profile = inspect_model(str(DEMO / "tiny-llama"))  # what `--model launcher/demo/tiny-llama` sees
    assert (profile.architecture, profile.params, profile.tied_embeddings, profile.has_weights) == (
        "LlamaForCausalLM",
        1_032_064,
        False,
        False,
    )
    blocks = load_token_blocks(inspect_data(str(DEMO / "data" / "train.jsonl")), tokenizer, seq_len=128)
    assert blocks.shape == (462, 128) and int(blocks.max()) < len(tokenizer)
    assert int((blocks == tokenizer.eos_token_id).sum()) in (659, 660)  # one EOS per document; the tail may be cut
