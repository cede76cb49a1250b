"""Training data: find and check the user's data, and read its records (blocks.py tokenizes and packs them
into fixed-length blocks; sampling.py decides which block each rank reads).

    inspect_data(path)                      cheap, no tokenizer: the CLI calls it before launching anything

Formats: a `datasets` save_to_disk folder ("arrow"), or one file / a folder of files of one kind: .jsonl,
.json (a list of records, a dict of columns, or JSON Lines), .txt, .parquet, .csv. A folder is searched
recursively (hidden entries and files of other kinds, e.g. README.md, are skipped) and read in sorted path
order. A .txt file holds one document per line (as `datasets`' "text" loader reads it); blank lines are
skipped. Files are read directly (stdlib json/csv, pyarrow for parquet), which is faster than
`datasets.load_dataset` and writes no cache anywhere; only save_to_disk folders go through
`datasets.load_from_disk`, which memory-maps and writes nothing either.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from launcher.errors import UserInputError

SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "json", ".txt": "txt", ".parquet": "parquet", ".csv": "csv"}
SUPPORTED = "a datasets save_to_disk folder, or .jsonl, .json, .txt, .parquet or .csv files"
INPUT_IDS = "input_ids"
_INSPECT_RECORDS = 100  # records per jsonl file whose keys inspect_data() reads
_BATCH_RECORDS = 1000  # records per read batch (arrow, parquet), and documents per tokenizer call (blocks.py)


@dataclass(frozen=True)
class DataSource:
    """What inspect_data() found: enough to read the data and to key its token cache."""

    path: str  # as the user gave it
    format: str  # "arrow" | "jsonl" | "json" | "txt" | "parquet" | "csv"
    files: tuple[str, ...]  # data files in read order (empty for "arrow")
    fields: tuple[str, ...]  # column names seen, in order of first appearance (("text",) for txt)
    has_input_ids: bool  # some records are already tokenized
    fingerprint: str  # sha256 over format, paths, sizes and mtimes; changes when any file does


# ---------------------------------------------------------------------------------------------- inspect


def inspect_data(path: str, text_field: str = "text") -> DataSource:
    """Find the data at `path`, check it can be trained on, and fingerprint it. Reads headers and first
    records only (a .json file is parsed whole). Raises UserInputError with one line on any problem."""
    root = Path(path)
    if not root.exists():
        raise UserInputError(f"data path {path} does not exist; pass {SUPPORTED}")
    if root.is_dir() and _is_saved_dataset(root):
        split_dir = _arrow_split_dir(root)
        fields = _arrow_fields(split_dir)
        _check_fields(fields, text_field, str(root))
        return DataSource(str(path), "arrow", (), fields, INPUT_IDS in fields, _fingerprint("arrow", root, _walk(root)))

    files = _data_files(root)
    fmt = SUFFIX_FORMATS[files[0].suffix.lower()]
    non_empty = [f for f in files if f.stat().st_size > 0]
    seen: dict[str, None] = {}  # ordered union of every file's fields
    for file in non_empty:
        fields = _file_fields(file, fmt)
        if fields:
            _check_fields(fields, text_field, str(file))
        seen.update(dict.fromkeys(fields))
    if not seen:
        raise UserInputError(f"data in {path} is empty (no records in {len(files)} file(s)); add data")
    fields = tuple(seen)
    return DataSource(
        str(path), fmt, tuple(map(str, files)), fields, INPUT_IDS in fields, _fingerprint(fmt, root, files)
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


def _check_fields(fields: tuple[str, ...], text_field: str, where: str) -> None:
    if text_field not in fields and INPUT_IDS not in fields:
        raise UserInputError(
            f"no '{text_field}' field (and no '{INPUT_IDS}') in {where}; its fields are {', '.join(fields)}; "
            f"pass --text-field with the one holding the text"
        )


def _file_fields(file: Path, fmt: str) -> tuple[str, ...]:
    if fmt == "txt":
        with _open_text(file) as handle:
            return ("text",) if any(line.strip() for line in handle) else ()
    if fmt == "csv":
        with _open_text(file) as handle:
            return tuple(next(csv.reader(handle), ()))
    if fmt == "parquet":
        return tuple(_pyarrow_parquet().ParquetFile(file).schema_arrow.names)
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


# ------------------------------------------------------------------------------------ save_to_disk folders


def _is_saved_dataset(root: Path) -> bool:
    return (root / "dataset_dict.json").is_file() or (
        (root / "state.json").is_file() and (root / "dataset_info.json").is_file()
    )


def _arrow_split_dir(root: Path) -> Path:
    """The folder of the Dataset to train on: `root` itself, or its "train" split (or its only split)."""
    if not (root / "dataset_dict.json").is_file():
        return root
    splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
    if "train" in splits:
        return root / "train"
    if len(splits) == 1:
        return root / splits[0]
    raise UserInputError(
        f"{root} holds splits {', '.join(splits) or '(none)'} and none is 'train'; "
        f"save the split to train on as 'train' or pass its folder ({root}/<split>)"
    )


def _arrow_fields(split_dir: Path) -> tuple[str, ...]:
    info = split_dir / "dataset_info.json"
    features = json.loads(info.read_text()).get("features") if info.is_file() else None
    if features:
        return tuple(features)
    return tuple(_load_from_disk(split_dir).column_names)


def _load_from_disk(split_dir: Path):
    try:
        import datasets
    except ImportError:
        raise UserInputError(f"reading {split_dir} needs the 'datasets' package; pip install datasets") from None
    return datasets.load_from_disk(str(split_dir))


# ----------------------------------------------------------------------------------------------- records


def _open_text(file: Path):
    return open(file, encoding="utf-8", newline="")  # noqa: SIM115 - callers close it


def _json_records(file: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) from a .jsonl file, or a .json file holding a list of records, a dict of equal-length
    columns, or JSON Lines."""
    if file.suffix.lower() == ".json":
        text = file.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # several top-level values: JSON Lines in a .json file
                raise UserInputError(f"{file}:{exc.lineno}: invalid JSON ({exc.msg}); fix or regenerate it") from None
        else:
            yield from _json_document_records(file, data)
            return
    with _open_text(file) as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{file}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserInputError(f"{where}: invalid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise UserInputError(f'{where}: expected a JSON object such as {{"text": ...}}, got {line[:40]!r}')
            yield where, record


def _json_document_records(file: Path, data: object) -> Iterator[tuple[str, dict]]:
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        if len({len(v) for v in data.values()}) > 1:
            raise UserInputError(f"{file}: its columns have different lengths; every column needs one value per record")
        columns = list(data)
        for index, values in enumerate(zip(*data.values(), strict=True)):
            yield f"{file} record {index}", dict(zip(columns, values, strict=True))
        return
    records = [data] if isinstance(data, dict) else data  # a single object: one record (one line of JSON Lines)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise UserInputError(f"{file}: expected a list of JSON objects, a dict of columns, or JSON Lines")
    for index, record in enumerate(records):
        yield f"{file} record {index}", record


def _records(source: DataSource, text_field: str) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record, in file order; only the text and input_ids columns are read."""
    wanted = (text_field, INPUT_IDS)
    if source.format == "arrow":
        dataset = _load_from_disk(_arrow_split_dir(Path(source.path))).with_format(None)
        columns = [c for c in wanted if c in dataset.column_names]
        index = 0
        for batch in dataset.select_columns(columns).iter(batch_size=_BATCH_RECORDS):
            for values in zip(*(batch[c] for c in columns), strict=True):
                yield f"{source.path} record {index}", dict(zip(columns, values, strict=True))
                index += 1
        return
    for name in source.files:
        file = Path(name)
        if file.stat().st_size == 0:
            continue
        if source.format in ("jsonl", "json"):
            yield from _json_records(file)
        elif source.format == "txt":
            with _open_text(file) as handle:
                for lineno, line in enumerate(handle, 1):
                    if line.strip():
                        yield f"{file}:{lineno}", {"text": line.rstrip("\r\n")}
        elif source.format == "csv":
            with _open_text(file) as handle:
                for lineno, record in enumerate(csv.DictReader(handle), 2):
                    yield f"{file}:{lineno}", record
        else:  # parquet
            parquet = _pyarrow_parquet().ParquetFile(file)
            columns = [c for c in wanted if c in parquet.schema_arrow.names]
            index = 0
            for batch in parquet.iter_batches(batch_size=_BATCH_RECORDS, columns=columns):
                for record in batch.to_pylist():
                    yield f"{file} record {index}", record
                    index += 1


def _pyarrow_parquet():
    try:
        import pyarrow.parquet
    except ImportError:
        raise UserInputError("reading .parquet files needs the 'pyarrow' package; pip install pyarrow") from None
    return pyarrow.parquet
