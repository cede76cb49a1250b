"""Tokenize the user's records (sources.py reads them) and pack them into fixed-length blocks, cached on disk
(sampling.py decides which block each rank reads).

    load_token_blocks(source, tokenizer, seq_len)    (n_blocks, seq_len) int64, cached on disk
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from launcher.data.sources import _BATCH_RECORDS, INPUT_IDS, DataSource, _check_fields, _records
from launcher.errors import UserInputError

_CACHE_VERSION = 1  # bump when the packed layout changes, so old caches are not reused
_PROBES = (  # encoded to fingerprint a tokenizer's behaviour, not just its name
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "ZeRO-3 offloads 12 bytes/param of Adam state to CPU RAM: 7e9 * 12 = 84,000,000,000.",
    "  indented\n\tline\r\nüber naïve café 東京 🙂",
    "<s></s><unk><pad><|endoftext|>",
)


def load_token_blocks(
    source: DataSource,
    tokenizer,
    seq_len: int,
    text_field: str = "text",
    cache_dir: str | Path | None = None,
) -> np.ndarray:
    """Tokenize every document, put EOS after each, concatenate, and cut into `seq_len`-token blocks.

    Returns an int64 array of shape (n_blocks, seq_len); the tail that does not fill a block is dropped.
    - Text is tokenized without special tokens (no BOS); `tokenizer.eos_token_id` follows every document,
      so `[doc1, EOS, doc2, EOS, ...]` is the stream. Documents that tokenize to nothing are skipped, as are
      records whose text is null or missing.
    - A record with a non-null `input_ids` is used as it is instead of its text (it wins over the text
      field). EOS is appended unless its last token already is EOS, so documents stay separated exactly
      once either way. Its ids must lie in [0, len(tokenizer)).
    - With `cache_dir`, the blocks are saved as `<cache_dir>/<cache_key(...)>.npy` (written to a temporary
      file, then renamed, so concurrent ranks and crashes never leave a partial cache) and the next call
      with the same data, tokenizer, seq_len and text field loads them without tokenizing.
    """
    if seq_len < 1:
        raise UserInputError(f"--seq-len must be at least 1, got {seq_len}")
    _check_fields(source.fields, text_field, source.path)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserInputError(
            f"tokenizer {tokenizer.name_or_path or type(tokenizer).__name__} has no eos_token, which separates "
            f"documents; set eos_token in its tokenizer_config.json"
        )
    cache_path = None
    if cache_dir is not None:
        cache_path = Path(cache_dir) / f"{cache_key(source, tokenizer, seq_len, text_field)}.npy"
        cached = _read_cache(cache_path, seq_len)
        if cached is not None:
            return cached
    tokens = np.concatenate([np.zeros(0, np.int64), *_token_chunks(source, tokenizer, text_field, eos)])
    n_blocks = tokens.size // seq_len
    if n_blocks < 1:
        raise UserInputError(
            f"data in {source.path} yields {tokens.size} tokens, fewer than one --seq-len block of {seq_len}; "
            f"add data or lower --seq-len"
        )
    blocks = tokens[: n_blocks * seq_len].reshape(n_blocks, seq_len)
    if cache_path is not None:
        _write_cache(cache_path, blocks)
    return blocks


def _token_chunks(source: DataSource, tokenizer, text_field: str, eos: int) -> Iterator[np.ndarray]:
    """The EOS-separated token stream, one int64 array per batch of documents."""
    vocab = len(tokenizer)
    records = _records(source, text_field)
    while batch := list(islice(records, _BATCH_RECORDS)):
        docs = [_document(where, record, text_field, vocab) for where, record in batch]
        texts = [d for d in docs if isinstance(d, str)]
        encoded = iter(_encode(tokenizer, texts)) if texts else iter(())
        ids: list[int] = []
        for doc in docs:
            doc_ids = next(encoded) if isinstance(doc, str) else doc
            if doc_ids is None or len(doc_ids) == 0:
                continue
            ids.extend(doc_ids)
            if doc_ids[-1] != eos:
                ids.append(eos)
        yield np.asarray(ids, dtype=np.int64)


def _document(where: str, record: dict, text_field: str, vocab: int) -> str | list[int] | None:
    ids = record.get(INPUT_IDS)
    if isinstance(ids, str):  # a csv cell holding "[1, 2, 3]"; anything else unparsable is reported below
        with contextlib.suppress(ValueError, RecursionError):  # bad JSON, a number too long, nesting too deep
            ids = json.loads(ids) if ids.strip() else None
    if ids is not None:
        try:
            array = np.asarray(ids)
        except ValueError:  # ragged nested lists
            array = np.zeros((0, 0))
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise UserInputError(f"{where}: {INPUT_IDS} is not a list of integers; fix it or drop the column")
        if array.size and (array.min() < 0 or array.max() >= vocab):
            bad = int(array.max() if array.max() >= vocab else array.min())
            raise UserInputError(
                f"{where}: {INPUT_IDS} holds token id {bad}, outside the tokenizer's {vocab} tokens; "
                f"tokenize with this model's tokenizer, or drop {INPUT_IDS} and keep the text"
            )
        return array.tolist()
    text = record.get(text_field)
    if text is None or isinstance(text, str):
        _check_unicode(where, text, text_field)
        return text
    raise UserInputError(
        f"{where}: '{text_field}' holds a {type(text).__name__}, not text; pass --text-field with a text column"
    )


def _check_unicode(where: str, text: str | None, text_field: str) -> None:
    """A JSON escape such as "\\ud800" decodes to half a surrogate pair, which is no text a tokenizer takes."""
    if text and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UserInputError(
                f"{where}: '{text_field}' holds {text[exc.start]!r}, half of a surrogate pair, not a character; "
                f"fix that \\u escape or drop the record"
            ) from None


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    # verbose=False: documents longer than model_max_length are expected here (they are packed, not truncated)
    out = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)
    return out["input_ids"]


def cache_key(source: DataSource, tokenizer, seq_len: int, text_field: str = "text") -> str:
    """Name of the packed-blocks cache: changes with the data, the tokenizer's behaviour, seq_len, the field."""
    probes = json.dumps(_encode(tokenizer, list(_PROBES)))
    identity = {
        "version": _CACHE_VERSION,
        "data": source.fingerprint,
        "tokenizer": str(tokenizer.name_or_path),
        "vocab": len(tokenizer),
        "eos": tokenizer.eos_token_id,
        "probes": hashlib.sha256(probes.encode()).hexdigest(),
        "seq_len": seq_len,
        "text_field": text_field,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"blocks-{seq_len}-{digest[:24]}"


def _read_cache(path: Path, seq_len: int) -> np.ndarray | None:
    try:
        blocks = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError):
        return None  # unreadable (e.g. truncated by hand): rebuild it
    if blocks.ndim != 2 or blocks.shape[1] != seq_len or blocks.dtype != np.int64 or len(blocks) == 0:
        return None
    return blocks


def _write_cache(path: Path, blocks: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    except OSError as exc:
        raise UserInputError(
            f"cannot write the token cache in {path.parent} ({exc.strerror}); use a writable folder"
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            np.save(handle, blocks, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
