"""What the data tests share: a word-level tokenizer built here (so every expected id is known), three
documents, one writer per input format, and a check that an error is one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from launcher.errors import UserInputError

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


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(UserInputError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def token_rows(source, tokenizer, seq_len: int, text_field: str = "text", cache_dir=None, **layout):
    """The token ids of every row load_token_set makes (text streamed as it comes, unless `layout` says)."""
    from launcher.data.blocks import load_token_set
    from launcher.data.rows import Tokenization

    tokenization = Tokenization(seq_len, format=source.kind, text_field=text_field, **layout)
    return load_token_set(source, tokenizer, tokenization, cache_dir).arrays["input_ids"]
