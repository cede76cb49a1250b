"""Training data: find and check the user's data, and list its records (readers.py reads each file, formats.py
says what a record means, blocks.py tokenizes them into fixed-length rows; sampling.py decides which row each rank
reads).

    inspect_data(path)                      cheap, no tokenizer: the CLI calls it before launching anything

Formats: a `datasets` save_to_disk folder ("arrow"), or one file / a folder of files of one kind: .jsonl,
.json (a list of records, a dict of columns, or JSON Lines), .txt, .parquet, .csv. A folder is searched
recursively (hidden entries and files of other kinds, e.g. README.md, are skipped) and read in sorted path
order. A .txt file holds one document per line (as `datasets`' "text" loader reads it); blank lines are
skipped. Every problem is one line (readers.py).
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from launcher.data.formats import INPUT_IDS, detect_format
from launcher.data.readers import (
    _arrow_fields,
    _arrow_records,
    _arrow_split_dir,
    _csv_lines,
    _csv_next,
    _is_saved_dataset,
    _json_records,
    _lines,
    _parquet_fields,
    _parquet_records,
    _unreadable,
)
from launcher.errors import UserInputError

SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "json", ".txt": "txt", ".parquet": "parquet", ".csv": "csv"}
SUPPORTED = "a datasets save_to_disk folder, or .jsonl, .json, .txt, .parquet or .csv files"
_INSPECT_RECORDS = 100  # records per jsonl file whose keys inspect_data() reads


@dataclass(frozen=True)
class DataSource:
    """What inspect_data() found: enough to read the data and to key its token cache."""

    path: str  # as the user gave it
    format: str  # "arrow" | "jsonl" | "json" | "txt" | "parquet" | "csv"
    files: tuple[str, ...]  # data files in read order (empty for "arrow")
    fields: tuple[str, ...]  # column names seen, in order of first appearance (("text",) for txt)
    has_input_ids: bool  # some records are already tokenized
    kind: str  # what the records hold: formats.FORMATS (chat, instruction, prompt, pairs, text)
    fingerprint: str  # sha256 over format, paths, sizes and mtimes; changes when any file does


# ---------------------------------------------------------------------------------------------- inspect


def inspect_data(path: str, text_field: str = "text", data_format: str = "auto") -> DataSource:
    """Find the data at `path`, tell its format (formats.detect_format; `data_format` pins one), check every file
    holds it, and fingerprint it. Reads headers and first records only (a .json file is parsed whole). Raises
    UserInputError with one line on any problem."""
    try:
        return _inspect(path, text_field, data_format)
    except OSError as exc:  # a path that cannot be stat'ed or opened: permissions, a broken link, a directory
        raise _unreadable(exc, path) from None


def _inspect(path: str, text_field: str, data_format: str) -> DataSource:
    root = Path(path)
    if not root.exists():
        raise UserInputError(f"data path {path} does not exist; pass {SUPPORTED}")
    if root.is_dir() and _is_saved_dataset(root):
        split_dir = _arrow_split_dir(root)
        fields = _arrow_fields(split_dir)
        kind = detect_format(fields, text_field, data_format, str(root))
        fingerprint = _fingerprint("arrow", root, _walk(root))
        return DataSource(str(path), "arrow", (), fields, INPUT_IDS in fields, kind, fingerprint)

    files = _data_files(root)
    fmt = SUFFIX_FORMATS[files[0].suffix.lower()]
    non_empty = [f for f in files if f.stat().st_size > 0]
    per_file = {file: _file_fields(file, fmt) for file in non_empty}
    seen: dict[str, None] = {}  # ordered union of every file's fields
    for fields in per_file.values():
        seen.update(dict.fromkeys(fields))
    if not seen:
        raise UserInputError(f"data in {path} is empty (no records in {len(files)} file(s)); add data")
    fields = tuple(seen)
    kind = detect_format(fields, text_field, data_format, str(path))
    for file, fields in per_file.items():  # one format for the whole set: every file holds its fields
        if fields:
            detect_format(fields, text_field, kind, str(file))
    return DataSource(
        str(path), fmt, tuple(map(str, files)), fields, INPUT_IDS in fields, kind, _fingerprint(fmt, root, files)
    )


def _data_files(root: Path) -> list[Path]:
    if root.is_file():
        if root.suffix.lower() not in SUFFIX_FORMATS:
            raise UserInputError(f"unsupported data format '{root.suffix or root.name}' for {root}; pass {SUPPORTED}")
        if root.stat().st_size == 0:
            raise UserInputError(f"data file {root} is empty; add records to it or pass another file")
        return [root]
    found = _walk(root)
    if not found:
        raise UserInputError(f"data folder {root} is empty; put {SUPPORTED} in it")
    files = [f for f in found if f.suffix.lower() in SUFFIX_FORMATS]
    if not files:
        others = ", ".join(sorted({f.suffix or f.name for f in found}))
        raise UserInputError(f"no supported data files in {root} (found {others}); pass {SUPPORTED}")
    suffixes = sorted({f.suffix.lower() for f in files})
    if len(suffixes) > 1:
        raise UserInputError(f"data folder {root} mixes formats ({', '.join(suffixes)}); keep one format per folder")
    return files


def _walk(root: Path) -> list[Path]:
    """Every regular file under `root`, sorted, skipping hidden files and folders."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out.extend(Path(dirpath, name) for name in filenames if not name.startswith("."))
    return sorted(out)


def _file_fields(file: Path, fmt: str) -> tuple[str, ...]:
    if fmt == "txt":
        return ("text",) if any(line.strip() for _, line in _lines(file)) else ()
    if fmt == "csv":
        return tuple(_csv_next(file, csv.reader(_csv_lines(file))) or ())
    if fmt == "parquet":
        return _parquet_fields(file)
    records = islice(_json_records(file), _INSPECT_RECORDS) if fmt == "jsonl" else _json_records(file)
    seen: dict[str, None] = {}
    for _, record in records:
        seen.update(dict.fromkeys(record))
    return tuple(seen)


def _fingerprint(fmt: str, root: Path, files: list[Path]) -> str:
    digest = hashlib.sha256(f"{fmt}\n{root.resolve()}\n".encode())
    for file in sorted(files):
        stat = file.stat()
        digest.update(f"{file.resolve()}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- records


def _records(source: DataSource, wanted: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record, in file order; columnar formats read only the `wanted` columns."""
    try:
        yield from _read_records(source, wanted)
    except OSError as exc:  # a file that went away, changed into a folder or lost its permissions since inspect_data
        raise _unreadable(exc, source.path) from None


def _read_records(source: DataSource, wanted: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    if source.format == "arrow":
        yield from _arrow_records(source.path, wanted)
        return
    for name in source.files:
        file = Path(name)
        if file.stat().st_size == 0:
            continue
        if source.format in ("jsonl", "json"):
            yield from _json_records(file)
        elif source.format == "txt":
            for lineno, line in _lines(file):
                if line.strip():
                    yield f"{file}:{lineno}", {"text": line.rstrip("\r\n")}
        elif source.format == "csv":
            reader = csv.DictReader(_csv_lines(file))
            lineno = 2
            while (record := _csv_next(file, reader)) is not None:
                yield f"{file}:{lineno}", record
                lineno += 1
        else:
            yield from _parquet_records(file, wanted)
