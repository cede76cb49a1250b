"""Read the user's data files, record by record, each problem one line (sources.py finds the files and says which
format they hold): a `datasets` save_to_disk folder, and .jsonl, .json, .txt, .csv and .parquet files.

Files are read directly (stdlib json/csv, pyarrow for parquet), which is faster than `datasets.load_dataset` and
writes no cache anywhere; only save_to_disk folders go through `datasets.load_from_disk`, which memory-maps and
writes nothing either.

Readers never raise anything but UserInputError on bad input: bytes that are not UTF-8 text (or hold a NUL),
malformed JSON or CSV, a file pyarrow or datasets cannot read, a path that cannot be opened. Each is one line,
`FILE[:LINE]: problem; what to do`, raised where the problem is found (inspect_data reads headers and first
records only, so load_token_blocks may find one deeper in a file).
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import UserInputError

_BATCH_RECORDS = 1000  # records per read batch (arrow, parquet), and documents per tokenizer call (blocks.py)
_DETAIL_CHARS = 160  # of a library's own error message, quoted in ours
_RESAVE = "save it again with save_to_disk"
_MAGIC = (  # leading bytes of files that are not text: what the file is, and what to do
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz)"),
    (b"BZh", "bzip2-compressed", "decompress it first (bunzip2)"),
    (b"PK\x03\x04", "a zip archive", "unzip it and pass the data file inside"),
    (b"PAR1", "a parquet file", "name it .parquet"),
    (b"\xff\xfe", "UTF-16 text", "convert it with iconv -f UTF-16 -t UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "convert it with iconv -f UTF-16 -t UTF-8"),
)


# ------------------------------------------------------------------------------------ save_to_disk folders


def _is_saved_dataset(root: Path) -> bool:
    return (root / "dataset_dict.json").is_file() or (
        (root / "state.json").is_file() and (root / "dataset_info.json").is_file()
    )


def _arrow_split_dir(root: Path) -> Path:
    """The folder of the Dataset to train on: `root` itself, or its "train" split (or its only split)."""
    index = root / "dataset_dict.json"
    if not index.is_file():
        return root
    meta = _read_json(index, _RESAVE)
    splits = meta.get("splits", []) if isinstance(meta, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) and re.fullmatch(r"\w+(\.\w+)*", s) for s in splits):
        raise UserInputError(f"{index}: 'splits' is not a list of split names; {_RESAVE}")
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
    meta = _read_json(info, _RESAVE) if info.is_file() else {}
    features = meta.get("features") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(features, dict | None):
        raise UserInputError(f"{info}: not the dataset_info.json save_to_disk writes; {_RESAVE}")
    if features:
        return tuple(features)
    return tuple(_load_from_disk(split_dir).column_names)


def _load_from_disk(split_dir: Path):
    """The Dataset saved in `split_dir` (memory-mapped). datasets reads its state.json and dataset_info.json by
    plain indexing, so a broken one raises KeyError, TypeError, ... and a broken .arrow file pyarrow's errors:
    each of these becomes the one-line error (only around this call, so no bug of ours is hidden)."""
    try:
        import datasets
        import pyarrow
    except ImportError:
        raise UserInputError(f"reading {split_dir} needs the 'datasets' package; pip install datasets") from None
    try:
        dataset = datasets.load_from_disk(str(split_dir))
    except (
        pyarrow.ArrowException,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        RecursionError,
    ) as exc:
        raise _bad_saved_dataset(split_dir, exc) from None
    if not isinstance(dataset, datasets.Dataset):
        raise UserInputError(
            f"{split_dir} holds several splits, not one; pass one split's folder ({split_dir}/<split>)"
        )
    return dataset


def _bad_saved_dataset(split_dir: Path, exc: BaseException) -> UserInputError:
    return UserInputError(f"{split_dir}: not a readable datasets save_to_disk folder ({_detail(exc)}); {_RESAVE}")


# ----------------------------------------------------------------------------------------------- records


def _open_text(file: Path):
    return open(file, encoding="utf-8", newline="")  # noqa: SIM115 - callers close it


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file, split as open(newline="") splits it (at \\n, \\r\\n or \\r).
    Bytes that are not UTF-8, or a NUL (which no text holds), raise UserInputError naming the line."""
    with _open_text(file) as handle:
        numbered = enumerate(handle, 1)
        while True:
            try:
                lineno, line = next(numbered)
            except StopIteration:
                return
            except UnicodeDecodeError:
                raise _not_utf8(file) from None
            if "\0" in line:
                raise _not_text(file, lineno, "a NUL byte", "binary or UTF-16")
            yield lineno, line


def _read_text(file: Path) -> str:
    """A whole UTF-8 text file; bytes that are not UTF-8, or a NUL, raise UserInputError naming the line."""
    with open(file, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_utf8(file) from None
    if "\0" in text:
        raise _not_text(file, text.count("\n", 0, text.index("\0")) + 1, "a NUL byte", "binary or UTF-16")
    return text


def _not_utf8(file: Path) -> UserInputError:
    """The error for a file that does not decode as UTF-8: found again from the start, in 1 MiB steps, so that
    it names the line of the first bad byte (counted as _lines counts them) however the caller read the file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lineno, after_cr = 1, False
    with open(file, "rb") as handle:
        while True:
            chunk = handle.read(1 << 20)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:  # exc.object: the bytes the decoder held back, then this chunk
                lineno += _line_ends(exc.object[: exc.start].decode("utf-8"), after_cr)
                return _not_text(file, lineno, f"byte 0x{exc.object[exc.start]:02x}")
            if not chunk:  # it decodes now: the file changed while it was read
                return _not_text(file, lineno, "a byte")
            lineno += _line_ends(text, after_cr)
            after_cr = text.endswith("\r") if text else after_cr


def _line_ends(text: str, after_cr: bool) -> int:
    """How many lines `text` ends (\\n, \\r\\n or a lone \\r); `after_cr`: the text before it ended with \\r."""
    return text.count("\n") + text.count("\r") - text.count("\r\n") - (after_cr and text.startswith("\n"))


def _not_text(file: Path, lineno: int, what: str, looks: str = "binary or is in another encoding") -> UserInputError:
    with open(file, "rb") as handle:
        head = handle.read(8)
    kind, fix = next(
        ((f"is {kind}", fix) for magic, kind, fix in _MAGIC if head.startswith(magic)),
        (f"looks {looks}", "convert it to UTF-8 (iconv -t UTF-8) or pass the right file"),
    )
    return UserInputError(f"{file}:{lineno}: {what} is not UTF-8 text (the file {kind}); {fix}")


def _unreadable(exc: OSError, path: str | Path) -> UserInputError:
    return UserInputError(
        f"{exc.filename or path}: cannot read it ({exc.strerror or _detail(exc)}); make it readable "
        f"or pass another path"
    )


def _detail(exc: BaseException) -> str:
    """A library's error, shortened to fit one line of ours."""
    if isinstance(exc, KeyError):
        text = f"no key {exc}"
    else:
        lines = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def _json_problem(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "a number with too many digits"  # int() refuses more than sys.get_int_max_str_digits() digits


def _read_json(file: Path, fix: str) -> object:
    """A JSON metadata file (dataset_dict.json, dataset_info.json)."""
    try:
        return json.loads(_read_text(file))
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{file}:{exc.lineno}: invalid JSON ({exc.msg}); {fix}") from None
    except (ValueError, RecursionError) as exc:
        raise UserInputError(f"{file}: invalid JSON ({_json_problem(exc)}); {fix}") from None


def _json_records(file: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) from a .jsonl file, or a .json file holding a list of records, a dict of equal-length
    columns, or JSON Lines."""
    if file.suffix.lower() == ".json":
        text = _read_text(file)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # several top-level values: JSON Lines in a .json file
                raise UserInputError(f"{file}:{exc.lineno}: invalid JSON ({exc.msg}); fix or regenerate it") from None
        except (ValueError, RecursionError) as exc:
            raise UserInputError(f"{file}: invalid JSON ({_json_problem(exc)}); fix or regenerate it") from None
        else:
            yield from _json_document_records(file, data)
            return
    for lineno, line in _lines(file):
        if not line.strip():
            continue
        where = f"{file}:{lineno}"
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise UserInputError(
                f"{where}: invalid JSON ({_json_problem(exc)}); each line must be one JSON object"
            ) from None
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


def _csv_lines(file: Path) -> Iterator[str]:
    return (line for _, line in _lines(file))


def _csv_next(file: Path, reader):
    """The next row of a csv.reader or csv.DictReader over _csv_lines(file) (None at the end)."""
    start = reader.line_num + 1
    try:
        return next(reader, None)
    except csv.Error as exc:  # in practice a field over csv.field_size_limit(): an unclosed quote, or a huge cell
        raise UserInputError(
            f"{file}:{start}: bad CSV row ({exc}); close its quotes, or keep documents this long in .jsonl or .parquet"
        ) from None


def _arrow_records(path: str, wanted: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    split_dir = _arrow_split_dir(Path(path))
    dataset = _load_from_disk(split_dir)
    import pyarrow  # after _load_from_disk, which says what to install when datasets (and pyarrow) is missing

    columns = [c for c in wanted if c in dataset.column_names]
    batches = dataset.with_format("arrow").select_columns(columns).iter(batch_size=_BATCH_RECORDS)
    index = 0
    while True:
        try:
            batch = next(batches, None)
            if batch is None:
                return
            batch.validate(full=True)  # a corrupt .arrow file is memory-mapped: unchecked, reading it may crash
            records = batch.to_pylist()
        except (pyarrow.ArrowException, OSError, ValueError) as exc:
            raise _bad_saved_dataset(split_dir, exc) from None
        for record in records:
            yield f"{path} record {index}", record
            index += 1


def _pyarrow_parquet():
    try:
        import pyarrow.parquet
    except ImportError:
        raise UserInputError("reading .parquet files needs the 'pyarrow' package; pip install pyarrow") from None
    return pyarrow.parquet


def _parquet_fields(file: Path) -> tuple[str, ...]:
    with _parquet_errors(file):
        return tuple(_open_parquet(file).schema_arrow.names)


def _parquet_records(file: Path, wanted: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    with _parquet_errors(file):
        parquet = _open_parquet(file)
        columns = [c for c in wanted if c in parquet.schema_arrow.names]
        batches = parquet.iter_batches(batch_size=_BATCH_RECORDS, columns=columns)
    index = 0
    while True:
        with _parquet_errors(file):
            batch = next(batches, None)
            if batch is None:
                return
            records = batch.to_pylist()  # a string that is not UTF-8 raises UnicodeDecodeError here
        for record in records:
            yield f"{file} record {index}", record
            index += 1


def _open_parquet(file: Path):
    open(file, "rb").close()  # an unreadable path raises Python's OSError, which names it (pyarrow's may not)
    return _pyarrow_parquet().ParquetFile(file)  # reads the footer


@contextlib.contextmanager
def _parquet_errors(file: Path) -> Iterator[None]:
    """pyarrow's errors (ArrowException, or OSError and ValueError from its IO and decoding) reading an opened
    .parquet file: it is not parquet, or it is corrupt."""
    _pyarrow_parquet()
    import pyarrow

    try:
        yield
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:  # from open(): not pyarrow's
            raise
        raise UserInputError(
            f"{file}: not a readable parquet file ({_detail(exc)}); write it again (e.g. DataFrame.to_parquet) "
            f"or pass the right file"
        ) from None
