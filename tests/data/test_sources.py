"""launcher/data/sources.py: every input format is found and read (checked through the packed stream), and each
user error in the data says what is wrong and what to do."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launcher.data.sources import inspect_data
from launcher.errors import UserInputError
from tests.data.corpus import DOCS, WRITERS, one_line_error, stream, token_rows, write_csv, write_jsonl
from tests.helpers import REPO

DEMO = REPO / "launcher" / "demo"


# ------------------------------------------------------------------------------------------ formats


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_every_format_packs_the_same_eos_separated_stream(fmt, tmp_path, tokenizer):
    path = WRITERS[fmt](tmp_path, {"text": DOCS})
    source = inspect_data(str(path))
    assert source.format == fmt
    assert source.fields == ("text",)
    assert not source.has_input_ids
    assert source.files == (() if fmt == "arrow" else (str(path),))
    blocks = token_rows(source, tokenizer, seq_len=5)
    assert blocks.dtype == np.int64
    assert blocks.tolist() == np.array(stream(DOCS)).reshape(3, 5).tolist()


@pytest.mark.parametrize("fmt", ["arrow", "jsonl", "json", "parquet", "csv"])
def test_text_field_other_than_text(fmt, tmp_path, tokenizer):
    path = WRITERS[fmt](tmp_path, {"id": ["a", "b", "c"], "body": DOCS})
    with pytest.raises(UserInputError, match="'text' or 'input_ids' field; its fields are id, body"):
        inspect_data(str(path))
    source = inspect_data(str(path), text_field="body")
    assert source.fields == ("id", "body")
    assert token_rows(source, tokenizer, seq_len=15, text_field="body").tolist() == [stream(DOCS)]


def test_json_variants_dict_of_columns_and_json_lines(tmp_path, tokenizer):
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps({"text": DOCS}))
    lines = tmp_path / "lines" / "data.json"
    lines.parent.mkdir()
    lines.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    for path in (columns, lines):
        assert token_rows(inspect_data(str(path)), tokenizer, seq_len=15).tolist() == [stream(DOCS)]
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"text": DOCS[0], "id": 1}))
    assert token_rows(inspect_data(str(single)), tokenizer, seq_len=5).tolist() == [stream(DOCS[:1])]
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
        assert token_rows(source, tokenizer, seq_len=15).tolist() == [stream(DOCS)]
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
    assert token_rows(source, tokenizer, seq_len=15).tolist() == [stream(DOCS)]


# ------------------------------------------------------------------------------------------ user errors


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
        f"nothing to train on in {path}: no 'messages', 'instruction'+'output', 'prompt'+'completion', "
        "'source'+'target', 'text' or 'input_ids' field; its fields are title, body; pass --text-field with the one "
        "holding the text"
    )


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
    blocks = token_rows(inspect_data(str(DEMO / "data" / "train.jsonl")), tokenizer, seq_len=128)
    assert blocks.shape == (462, 128) and int(blocks.max()) < len(tokenizer)
    assert int((blocks == tokenizer.eos_token_id).sum()) in (659, 660)  # one EOS per document; the tail may be cut
