"""Readers never raise: undecodable, binary or malformed input in every format (and a path that cannot be read)
is one line, `FILE[:LINE]: problem; what to do`, from inspect_data or, deeper in a file, from token_rows."""

from __future__ import annotations

import builtins
import csv
import errno
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.data import readers
from launcher.data.sources import inspect_data
from tests.data.corpus import DOCS, one_line_error, token_rows, write_arrow, write_jsonl, write_parquet
from tests.helpers import REPO

NOT_UTF8 = "is not UTF-8 text (the file looks binary or is in another encoding); convert it to UTF-8 (iconv -t UTF-8)"
RESAVE = "save it again with save_to_disk"
MANY = 2000  # records before the bad ones: past what inspect_data reads (100 records, and the 8 KiB around them)


def load_error(path: Path, tokenizer, **kwargs) -> str:
    """The one-line error token_rows raises for data that inspect_data accepts."""
    return one_line_error(token_rows, inspect_data(str(path), **kwargs), tokenizer, 2, **kwargs)


# ------------------------------------------------------------------------------------------ not UTF-8 text


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt", ".csv"])
def test_random_bytes_in_every_text_format(suffix, tmp_path):
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(bytes(range(256)) * 80)  # like `head -c 20000 /dev/urandom`: 0x0a and 0x0d end lines 1 and 2
    assert one_line_error(inspect_data, str(path)) == f"{path}:3: byte 0x80 {NOT_UTF8} or pass the right file"


def test_the_line_is_the_line_of_the_first_bad_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "zero"}\r\n{"text": "one"}\r{"text": "caf\xe9"}\n{"text": "\xff"}\n')
    assert one_line_error(inspect_data, str(path)).startswith(f"{path}:3: byte 0xe9 is not UTF-8 text")


CHUNK = 1 << 20  # the steps in which the first bad byte is looked for


@pytest.mark.parametrize(
    ("prefix", "across"),
    [
        ("zero\n" * (CHUNK // 5 - 1) + "abcde\r\n", "\r\n"),
        ("é" * (CHUNK // 2 - 1) + "aé\n" + "zero\r" * 3, "é"),  # then lone \r line ends
    ],
    ids=["crlf-across-chunks", "character-across-chunks"],
)
def test_line_counting_across_read_chunks(prefix, across, tmp_path):
    data = prefix.encode()
    assert data[CHUNK - 1 : CHUNK + 1] == across.encode()  # the first step ends inside it
    path = tmp_path / "data.json"
    path.write_bytes(data + b"\xc3(\n")
    line = len(prefix.splitlines()) + 1
    assert one_line_error(inspect_data, str(path)).startswith(f"{path}:{line}: byte 0xc3 is not UTF-8 text")


@pytest.mark.parametrize(
    ("suffix", "header", "record", "skip"),
    [
        (".jsonl", b"", b'{"text": "zero one"}\n', 0),
        (".txt", b"", b"zero one\n", 0),
        (".csv", b"text\n", b"zero one\n", 1),
        (".json", b"", b'{"text": "zero one"}\n', 0),  # JSON Lines in a .json file
    ],
)
def test_bad_bytes_deep_in_a_file_stop_the_tokenizing_in_one_line(suffix, header, record, skip, tmp_path, tokenizer):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(header + record * MANY + b"zero \xff one\n" + record)
    line = skip + MANY + 1
    if suffix == ".json":  # read whole: found at once
        assert one_line_error(inspect_data, str(path)).startswith(f"{path}:{line}: byte 0xff is not UTF-8 text")
        return
    assert load_error(path, tokenizer) == f"{path}:{line}: byte 0xff {NOT_UTF8} or pass the right file"


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (
            gzip.compress(b'{"text": "zero"}\n' * 50),
            "byte 0x8b is not UTF-8 text (the file is gzip-compressed); decompress it first (gunzip)",
        ),
        (
            '{"text": "zero"}\n'.encode("utf-16"),
            "byte 0xff is not UTF-8 text (the file is UTF-16 text); convert it with iconv -f UTF-16 -t UTF-8",
        ),
    ],
    ids=["gzip", "utf-16"],
)
def test_compressed_and_utf16_files_are_named(content, what, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    assert one_line_error(inspect_data, str(path)) == f"{path}:1: {what}"


@pytest.mark.parametrize("suffix", [".csv", ".txt", ".jsonl", ".json"])
def test_a_nul_byte_is_not_text(suffix, tmp_path, tokenizer):
    path = tmp_path / f"data{suffix}"
    header = "text\n" if suffix == ".csv" else ""
    path.write_text(header + '{"text": "zero"}\n' + '{"text": "one\0two"}\n')
    read_first = suffix in (".json", ".jsonl")  # a .json file is read whole; a .jsonl file's first 100 records
    message = one_line_error(inspect_data, str(path)) if read_first else load_error(path, tokenizer)
    line = 3 if suffix == ".csv" else 2
    assert message == (
        f"{path}:{line}: a NUL byte is not UTF-8 text (the file looks binary or UTF-16); "
        f"convert it to UTF-8 (iconv -t UTF-8) or pass the right file"
    )


def test_unpaired_surrogate_escape_in_json_text(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "zero one"}\n{"text": "two \\ud800 three"}\n')
    assert load_error(path, tokenizer) == (
        f"{path}:2: 'text' holds '\\ud800', half of a surrogate pair, not a character; "
        f"fix that \\u escape or drop the record"
    )


def test_field_names_with_control_characters_stay_on_one_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"title\\nline": "zero", "\\u0000": 1}\n')
    assert one_line_error(inspect_data, str(path)).endswith(
        "its fields are 'title\\nline', '\\x00'; pass --text-field with the one holding the text"
    )


# ------------------------------------------------------------------------------------------ malformed JSON


def test_json_nested_too_deeply(tmp_path):
    deep_lines = tmp_path / "deep.jsonl"
    deep_lines.write_text('{"text": "zero"}\n' + "[" * 100_000 + "\n")
    assert one_line_error(inspect_data, str(deep_lines)) == (
        f"{deep_lines}:2: invalid JSON (nested too deeply); each line must be one JSON object"
    )
    deep = tmp_path / "deep.json"
    deep.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert one_line_error(inspect_data, str(deep)) == f"{deep}: invalid JSON (nested too deeply); fix or regenerate it"


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="Python before 3.10.7 reads any integer")
def test_json_number_with_too_many_digits(tmp_path):
    number = tmp_path / "number.jsonl"
    number.write_text('{"text": "zero", "id": ' + "7" * 5000 + "}\n")
    assert one_line_error(inspect_data, str(number)) == (
        f"{number}:1: invalid JSON (a number with too many digits); each line must be one JSON object"
    )


def test_json_errors_deep_in_a_file_are_found_when_tokenizing(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "zero one"}\n' * MANY + "[" * 100_000 + "\n")
    assert load_error(path, tokenizer) == (
        f"{path}:{MANY + 1}: invalid JSON (nested too deeply); each line must be one JSON object"
    )


# ------------------------------------------------------------------------------------------ CSV


def test_csv_field_over_the_size_limit(tmp_path, tokenizer):
    limit = csv.field_size_limit()
    huge = tmp_path / "huge.csv"
    huge.write_text("text\n" + "zero\n" * MANY + "a" * (limit + 1) + "\n")
    assert load_error(huge, tokenizer) == (
        f"{huge}:{MANY + 2}: bad CSV row (field larger than field limit ({limit})); close its quotes, "
        f"or keep documents this long in .jsonl or .parquet"
    )
    header = tmp_path / "header.csv"
    header.write_text("a" * (limit + 1) + "\n")
    assert one_line_error(inspect_data, str(header)).startswith(f"{header}:1: bad CSV row (field larger than")


def test_csv_unclosed_quote_runs_into_the_limit(tmp_path, tokenizer):
    path = tmp_path / "quote.csv"
    path.write_text('text\nzero\n"one two\n' + "three four\n" * (csv.field_size_limit() // 10))
    assert load_error(path, tokenizer).startswith(f"{path}:3: bad CSV row (field larger than field limit")


def test_csv_input_ids_cell_nested_too_deeply(tmp_path, tokenizer):
    path = tmp_path / "ids.csv"
    path.write_text(f'text,input_ids\nzero,"{"[" * 5000}{"]" * 5000}"\n')
    assert load_error(path, tokenizer) == f"{path}:2: input_ids is not a list of integers; fix it or drop the column"


# ------------------------------------------------------------------------------------------ parquet


def test_not_a_parquet_file_or_a_truncated_one(tmp_path):
    text = tmp_path / "text.parquet"
    text.write_text('{"text": "zero"}\n')
    assert one_line_error(inspect_data, str(text)) == (
        f"{text}: not a readable parquet file (ArrowInvalid: Parquet magic bytes not found in footer. Either the "
        f"file is corrupted or this is not a parquet file.); write it again (e.g. DataFrame.to_parquet) or pass "
        f"the right file"
    )
    truncated = write_parquet(tmp_path, {"text": DOCS})
    truncated.write_bytes(truncated.read_bytes()[:-20])
    assert one_line_error(inspect_data, str(truncated)).startswith(f"{truncated}: not a readable parquet file (")


def test_corrupt_parquet_pages_are_found_when_tokenizing(tmp_path, tokenizer):
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "data.parquet"
    docs = [f"zero one two {i}" for i in range(100)]
    pyarrow.parquet.write_table(pyarrow.table({"text": docs}), path, compression="none", write_statistics=False)
    data = path.read_bytes()
    at = data.index(b"zero one two 42")  # in the dictionary page; the footer (read by inspect_data) is intact
    path.write_bytes(data[:at] + b"zero \xffne two 42" + data[at + 15 :])
    assert load_error(path, tokenizer).startswith(
        f"{path}: not a readable parquet file (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"
    )


# ------------------------------------------------------------------------------------------ save_to_disk folders


def test_broken_dataset_info_and_dataset_dict(tmp_path):
    saved = write_arrow(tmp_path, {"text": DOCS})
    info = saved / "dataset_info.json"
    for content, problem in (
        (b'{"features": ', "1: invalid JSON (Expecting value)"),
        (b"[" * 100_000, " invalid JSON (nested too deeply)"),
        (b"\x89PNG\r\n\x1a\n", "1: byte 0x89 is not UTF-8 text"),
        (b'{"features": ["text"]}', " not the dataset_info.json save_to_disk writes"),
        (b"[]", " not the dataset_info.json save_to_disk writes"),
    ):
        info.write_bytes(content)
        message = one_line_error(inspect_data, str(saved))
        assert message.startswith(f"{info}:{problem}"), message
        assert message.endswith(RESAVE) or "not UTF-8" in message
    index = tmp_path / "dict" / "dataset_dict.json"
    index.parent.mkdir()
    for content in (b'{"splits": ["../../etc"]}', b'{"splits": "train"}', b'{"splits": [["train"]]}', b"7"):
        index.write_bytes(content)
        assert (
            one_line_error(inspect_data, str(index.parent))
            == f"{index}: 'splits' is not a list of split names; {RESAVE}"
        )
    index.write_bytes(b'{"splits": ["train"]')
    assert one_line_error(inspect_data, str(index.parent)).startswith(f"{index}:1: invalid JSON (")


def test_broken_state_json_or_missing_split_is_found_when_tokenizing(tmp_path, tokenizer):
    saved = write_arrow(tmp_path, {"text": DOCS})  # inspect_data reads the fields from dataset_info.json
    state = saved / "state.json"
    good = state.read_text()
    for content, detail in (
        ("[1]", "TypeError: list indices must be integers or slices, not str"),
        ("{}", "no key '_data_files'"),
        ('{"_data_files": [{"filename": "gone.arrow"}]', "JSONDecodeError: Expecting ',' delimiter"),
        (good.replace('"_data_files"', '"_dat_files"'), "no key '_data_files'"),
        (good.replace(".arrow", ".missing"), "FileNotFoundError"),
    ):
        state.write_text(content)
        message = load_error(saved, tokenizer)
        assert message.startswith(f"{saved}: not a readable datasets save_to_disk folder ({detail}"), message
        assert message.endswith(f"); {RESAVE}")
    state.write_bytes(b"\xff\xfe{")
    assert "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff" in load_error(saved, tokenizer)

    import datasets

    dataset = datasets.Dataset.from_dict({"text": DOCS})
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(tmp_path / "no-train" / "train" / "nested"))
    (tmp_path / "no-train" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    message = one_line_error(inspect_data, str(tmp_path / "no-train"))
    assert message.startswith(f"{tmp_path / 'no-train' / 'train'}: not a readable datasets save_to_disk folder (")
    nested = tmp_path / "nested"
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(nested / "train"))
    (nested / "dataset_dict.json").write_text('{"splits": ["train"]}')
    assert one_line_error(inspect_data, str(nested)) == (
        f"{nested / 'train'} holds several splits, not one; pass one split's folder ({nested / 'train'}/<split>)"
    )


def test_truncated_arrow_file(tmp_path, tokenizer):
    saved = write_arrow(tmp_path, {"text": DOCS})
    arrow = next(saved.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:200])
    assert load_error(saved, tokenizer).startswith(f"{saved}: not a readable datasets save_to_disk folder (")


CORRUPT_OFFSETS = """
import struct, sys
from pathlib import Path
import datasets
from launcher.data.sources import _records, inspect_data
from launcher.errors import UserInputError

saved = Path(sys.argv[1])
datasets.disable_progress_bars()
datasets.Dataset.from_dict({"text": ["zero one", "two three four"]}).save_to_disk(str(saved))
arrow = next(saved.glob("*.arrow"))
offsets = struct.pack("<3i", 0, 8, 22)  # where each string starts: the last one now points 1 GiB past the end
arrow.write_bytes(arrow.read_bytes().replace(offsets, struct.pack("<3i", 0, 8, 1 << 30)))
try:
    list(_records(inspect_data(str(saved)), ("text",)))
except UserInputError as err:
    print(err)
"""


def test_corrupt_arrow_offsets_are_caught_before_they_are_read(tmp_path):
    """An unchecked memory-mapped arrow file with a bad offset crashes the process (a bus error) when read: run in
    a child process, so that a regression fails this test, not the whole session."""
    saved = tmp_path / "saved"
    child = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", CORRUPT_OFFSETS, str(saved)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith(f"{saved}: not a readable datasets save_to_disk folder (ArrowInvalid: ")
    assert child.stdout.strip().endswith(RESAVE) and child.stdout.count("\n") == 1


# ------------------------------------------------------------------------------------------ unreadable paths


def refuse_to_open(monkeypatch, path: Path) -> None:
    """Make `path` unreadable: chmod 000, or for root (who reads anything) an open() in readers.py that refuses."""
    if os.geteuid() != 0:
        path.chmod(0)
        return
    real_open = builtins.open

    def refusing(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(readers, "open", refusing, raising=False)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt", ".csv", ".parquet"])
def test_permission_denied(suffix, tmp_path, monkeypatch):
    path = write_parquet(tmp_path, {"text": DOCS}) if suffix == ".parquet" else tmp_path / f"data{suffix}"
    if suffix != ".parquet":
        path.write_text("text\nzero\n" if suffix == ".csv" else '{"text": "zero"}\n')
    refuse_to_open(monkeypatch, path)
    assert one_line_error(inspect_data, str(path)) == (
        f"{path}: cannot read it (Permission denied); make it readable or pass another path"
    )


def test_a_file_that_became_a_directory_or_a_broken_link(tmp_path, tokenizer):
    path = write_jsonl(tmp_path, {"text": DOCS})
    source = inspect_data(str(path))
    path.unlink()
    path.mkdir()
    assert one_line_error(token_rows, source, tokenizer, 2) == (
        f"{path}: cannot read it (Is a directory); make it readable or pass another path"
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder, {"text": DOCS}, name="a.jsonl")
    (folder / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")
    assert one_line_error(inspect_data, str(folder)) == (
        f"{folder / 'b.jsonl'}: cannot read it (No such file or directory); make it readable or pass another path"
    )


def test_good_data_still_reads_after_the_checks(tmp_path, tokenizer):
    """The checks cost nothing on good data: non-ASCII text, \\r\\n line ends, a BOM-free UTF-8 file."""
    path = tmp_path / "data.jsonl"
    path.write_bytes("".join(json.dumps({"text": d + " café 東京"}) + "\r\n" for d in DOCS).encode())
    blocks = token_rows(inspect_data(str(path)), tokenizer, 1)
    assert len(blocks) == 15 + 3 * 2  # each document gains two unknown words ([UNK])
