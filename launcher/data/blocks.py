"""Tokenize the user's records (sources.py reads them, formats.py says what each means) into the fixed-length
rows the ranks train on, cached on disk (sampling.py decides which row each rank reads).

    load_token_set(source, tokenizer, Tokenization(seq_len, ...), cache_dir)    -> TokenSet
    load_splits(data, tokenization, tokenizer, cache_dir, eval_...)           -> (training, held-out) TokenSets

Layouts (`Tokenization.packing`, chosen by packing_for):

    stream     documents concatenated, EOS after each, cut into seq_len rows (the tail that fills no row is
               dropped); attention crosses documents, as in pre-training. Text data, for a model whose code cannot
               keep packed documents apart.
    documents  the same rows, with position ids that restart at each document and each row: transformers turns
               them into a block-diagonal causal mask (masking_utils.find_packed_sequence_indices, used by every
               model whose code builds its mask with create_causal_mask, when no attention_mask is passed), so no
               document attends to another and each one sees positions from 0. A document's first token carries
               no loss (nothing of it came before).
    pad        one record per row, cut at seq_len and padded (attention_mask): supervised data for a model whose
               code cannot keep packed documents apart.
    seq2seq    one record per row: the source padded to seq_len for the encoder, the target to seq_len for the
               decoder (labels, -100 on padding), each with the tokenizer's special tokens (T5 ends both with </s>).

Loss: a token carries loss when its piece is trained (formats.Example); labels are -100 elsewhere, which every
transformers loss ignores (ForCausalLMLoss's ignore_index). Text is tokenized without special tokens (no BOS); a
chat template writes its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict
from itertools import islice
from pathlib import Path

import numpy as np

from launcher.data import formats
from launcher.data.formats import INPUT_IDS, Example, Renderer
from launcher.data.readers import _BATCH_RECORDS
from launcher.data.rows import IGNORE, PACKINGS, Tokenization, TokenSet, read_cache, write_cache
from launcher.data.sources import DataSource, _records, inspect_data
from launcher.errors import UserInputError

_CACHE_VERSION = 2  # bump when the layout changes, so old caches are not reused
_PROBES = (  # encoded to fingerprint a tokenizer's behaviour, not just its name
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "ZeRO-3 offloads 12 bytes/param of Adam state to CPU RAM: 7e9 * 12 = 84,000,000,000.",
    "  indented\n\tline\r\nüber naïve café 東京 🙂",
    "<s></s><unk><pad><|endoftext|>",
)


def packing_for(fmt: str, model_kind: str, packs_documents: bool) -> str:
    """The layout for `fmt` data and a model: seq2seq for encoder-decoders; packed documents kept apart where
    the model's code can (`packs_documents`, inspection: create_causal_mask and position_ids); else text is
    streamed as in pre-training and supervised records are padded, one per row."""
    if model_kind == "seq2seq-lm":
        return "seq2seq"
    if packs_documents:
        return "documents"
    return "stream" if fmt == "text" else "pad"


def packs_documents(model_type: str, trust_remote_code: bool = False) -> bool:
    """Whether transformers' own causal LM for `model_type` keeps packed documents apart when given restarting
    position ids: its module builds the attention mask with masking_utils.create_causal_mask (which finds the
    packed documents in position_ids) and its forward takes position_ids. A model with its own code
    (--trust-remote-code) or no causal LM class is not known to: False. Read from the modeling module's source
    (modeling_source_packs): importing it imports torch, seconds of every command; where the source cannot say,
    the module is imported (packs_documents_imported)."""
    if trust_remote_code:
        return False
    found = modeling_source_packs(model_type)
    return packs_documents_imported(model_type) if found is None else found


def modeling_source_packs(model_type: str) -> bool | None:
    """packs_documents from transformers/models/<type>/modeling_<type>.py's text: the module names
    create_causal_mask, and its one *ForCausalLM class's forward takes position_ids. None where the file is not
    there or does not hold exactly one such class (the caller imports the module instead)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    module = model_type.replace("-", "_")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / module / f"modeling_{module}.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    causal = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("ForCausalLM")]
    if len(causal) != 1:
        return None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    forward = next((n for n in causal[0].body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        return None
    arguments = [a.arg for a in (*forward.args.posonlyargs, *forward.args.args, *forward.args.kwonlyargs)]
    return "create_causal_mask" in names and "position_ids" in arguments


def packs_documents_imported(model_type: str) -> bool:
    """packs_documents by importing transformers' causal LM class for `model_type` (torch with it)."""
    import inspect
    import sys

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    try:
        cls = getattr(transformers, name) if name else None
    except (AttributeError, ImportError, RuntimeError):  # a class whose optional dependencies are missing
        return False
    if cls is None:
        return False
    builds_masks = "create_causal_mask" in vars(sys.modules.get(cls.__module__) or object)
    return builds_masks and "position_ids" in inspect.signature(cls.forward).parameters


def load_token_set(
    source: DataSource, tokenizer, tokenization: Tokenization, cache_dir: str | Path | None = None
) -> TokenSet:
    """Every record tokenized and laid out as `tokenization` says (module docstring). With `cache_dir`, saved as
    `<cache_dir>/<cache_key(...)>.npz` (written to a temporary file, then renamed, so concurrent ranks and
    crashes never leave a partial cache); the next call with the same data, tokenizer and tokenization loads it
    without tokenizing."""
    t = tokenization
    if t.seq_len < 1:
        raise UserInputError(f"--seq-len must be at least 1, got {t.seq_len}")
    if t.packing not in PACKINGS:
        raise ValueError(f"unknown packing {t.packing}")
    if t.chat_template is not None:
        tokenizer.chat_template = t.chat_template  # also what the export saves: the template it was trained with
    formats.detect_format(source.fields, t.text_field, t.format, source.path)
    if tokenizer.eos_token_id is None:
        raise UserInputError(
            f"tokenizer {tokenizer.name_or_path or type(tokenizer).__name__} has no eos_token, which separates "
            f"documents; set eos_token in its tokenizer_config.json"
        )
    cache_path = None
    if cache_dir is not None:
        cache_path = Path(cache_dir) / f"{cache_key(source, tokenizer, t)}.npz"
        cached = read_cache(cache_path, t.seq_len)
        if cached is not None:
            return cached
    examples = _examples(source, tokenizer, t)
    stats = {"records": 0, "skipped": 0, "truncated": 0}
    if t.packing in ("stream", "documents"):
        token_set = _packed(examples, t, tokenizer.eos_token_id, stats, source.path)
    else:
        token_set = _padded(examples, t, tokenizer, stats, source.path)
    if cache_path is not None:
        write_cache(cache_path, token_set)
    return token_set


# ------------------------------------------------------------------------------------------ records -> tokens

_Tokens = tuple[np.ndarray, np.ndarray, bool]  # (ids, trained per token, whether an EOS after them is trained)


def _examples(source: DataSource, tokenizer, t: Tokenization) -> Iterator[_Tokens | tuple[list, list] | None]:
    """Each record tokenized: causal (ids, trained, eos_trained), seq2seq (source ids, target ids), None when it
    holds nothing to train on. Texts are tokenized a batch of records at a time (one fast-tokenizer call)."""
    vocab = len(tokenizer)
    renderer = (
        None
        if t.format == "text"
        else Renderer(
            t.format, tokenizer, text_field=t.text_field, train_on_prompt=t.train_on_prompt, seq2seq=t.seq2seq
        )
    )
    records = _records(source, formats.columns(t.format, t.text_field))
    while batch := list(islice(records, _BATCH_RECORDS)):
        if renderer is None:
            rendered = [_text_example(where, record, t.text_field, vocab) for where, record in batch]
        else:
            rendered = [renderer.render(where, record) for where, record in batch]
        if t.seq2seq:
            sources = _encode(tokenizer, [e.source for e in rendered if e], special=True)
            targets = _encode(tokenizer, [e.target for e in rendered if e], special=True)
            pairs = iter(zip(sources, targets, strict=True))
            yield from (next(pairs) if e else None for e in rendered)
            continue
        texts = [piece for e in rendered if e for piece, _ in e.pieces if isinstance(piece, str)]
        encoded = iter(_encode(tokenizer, texts))
        for example in rendered:
            if example is None:
                yield None
                continue
            ids, trained = [], []
            for piece, carries_loss in example.pieces:
                piece_ids = next(encoded) if isinstance(piece, str) else piece
                ids.extend(piece_ids)
                trained.extend([carries_loss] * len(piece_ids))
            yield (np.asarray(ids, np.int64), np.asarray(trained, bool), example.eos_trained) if ids else None


def _text_example(where: str, record: dict, text_field: str, vocab: int) -> Example | None:
    document = _document(where, record, text_field, vocab)
    return Example(((document, True),)) if document else None


def _packed(examples, t: Tokenization, eos: int, stats: dict, where: str) -> TokenSet:
    """stream / documents: every example, EOS after each (unless it ends with one), concatenated and cut."""
    ids, trained, starts = [], [], []
    for example in examples:
        stats["records"] += 1
        if example is None or not example[1].any():
            stats["skipped"] += 1
            continue
        doc_ids, doc_trained, eos_trained = example
        if doc_ids[-1] != eos:
            doc_ids, doc_trained = np.append(doc_ids, eos), np.append(doc_trained, eos_trained)
        start = np.zeros(doc_ids.size, bool)
        start[0] = True
        ids.append(doc_ids)
        trained.append(doc_trained)
        starts.append(start)
    flat = np.concatenate([np.zeros(0, np.int64), *ids])
    n, L = flat.size // t.seq_len, t.seq_len
    if n < 1:
        raise UserInputError(
            f"data in {where} yields {flat.size} tokens, fewer than one --seq-len block of {L}; "
            f"add data or lower --seq-len"
        )
    arrays = {"input_ids": flat[: n * L].reshape(n, L)}
    mask = np.concatenate([np.zeros(0, bool), *trained])[: n * L].reshape(n, L)
    if t.packing == "documents":
        begins = np.concatenate([np.zeros(0, bool), *starts])[: n * L].reshape(n, L)
        begins[:, 0] = True
        index = np.broadcast_to(np.arange(L), (n, L))
        arrays["position_ids"] = (index - np.maximum.accumulate(np.where(begins, index, 0), axis=1)).astype(np.int32)
        mask = mask & ~begins
    if not mask[:, 1:].all():
        arrays["loss_mask"] = mask
    return TokenSet(arrays, stats)


def _padded(examples, t: Tokenization, tokenizer, stats: dict, where: str) -> TokenSet:
    """pad / seq2seq: one example per row, cut at seq_len, padded with the tokenizer's pad token (else EOS)."""
    L, eos = t.seq_len, tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows: list[tuple[np.ndarray, ...]] = []
    for example in examples:
        stats["records"] += 1
        if example is None:
            stats["skipped"] += 1
            continue
        if t.seq2seq:
            source, target = (np.asarray(x, np.int64) for x in example)
            stats["truncated"] += int(source.size > L or target.size > L)
            if target.size == 0:
                stats["skipped"] += 1
                continue
            rows.append((_fill(source[:L], L, pad), np.arange(L) < source[:L].size, _fill(target[:L], L, IGNORE)))
            continue
        ids, trained, eos_trained = example
        if ids[-1] != eos:
            ids, trained = np.append(ids, eos), np.append(trained, eos_trained)
        stats["truncated"] += int(ids.size > L)
        ids, trained = ids[:L], trained[:L]
        if not trained[1:].any():  # the prompt alone fills the row: nothing of the response is left
            stats["skipped"] += 1
            continue
        rows.append((_fill(ids, L, pad), np.arange(L) < ids.size, np.pad(trained, (0, L - ids.size))))
    if not rows:
        raise UserInputError(
            f"data in {where} yields no record with a response to train on within --seq-len {L} "
            f"({stats['records']} read); check the records' fields, or raise --seq-len"
        )
    ids, attention, third = (np.stack(column) for column in zip(*rows, strict=True))
    arrays = {"input_ids": ids, "attention_mask": attention}
    arrays["labels" if t.seq2seq else "loss_mask"] = third
    return TokenSet(arrays, stats)


def _fill(values: np.ndarray, length: int, value: int) -> np.ndarray:
    return np.pad(values, (0, length - values.size), constant_values=value)


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


def _encode(tokenizer, texts: list[str], special: bool = False) -> list[list[int]]:
    if not texts:
        return []
    # verbose=False: documents longer than model_max_length are expected here (they are packed or cut, not refused)
    out = tokenizer(texts, add_special_tokens=special, return_attention_mask=False, verbose=False)
    return out["input_ids"]


# ------------------------------------------------------------------------------------------ cache


def cache_key(source: DataSource, tokenizer, tokenization: Tokenization) -> str:
    """Name of the token cache: changes with the data, the tokenizer's behaviour (its chat template too) and
    the tokenization."""
    probes = json.dumps(_encode(tokenizer, list(_PROBES)))
    layout = asdict(tokenization)
    template = layout.pop("chat_template") or getattr(tokenizer, "chat_template", None) or ""
    identity = {
        "version": _CACHE_VERSION,
        "data": source.fingerprint,
        "tokenizer": str(tokenizer.name_or_path),
        "vocab": len(tokenizer),
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
        "probes": hashlib.sha256(probes.encode()).hexdigest(),
        "chat_template": hashlib.sha256(str(template).encode()).hexdigest(),
        **layout,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"tokens-{tokenization.seq_len}-{digest[:24]}"


def load_splits(
    data: str,
    tokenization: Tokenization,
    tokenizer,
    cache_dir: str | Path | None = None,
    *,
    eval_data: str | None = None,
    eval_fraction: float | None = None,
) -> tuple[TokenSet, TokenSet | None]:
    """(training rows, held-out rows or None): `data` tokenized; the held-out rows are --eval-fraction of its rows
    (TokenSet.hold_out) or --eval-data, read in the training data's format. What the CLI checks before launching
    and every rank loads (from the cache the CLI filled), so both see the same rows."""
    source = inspect_data(data, tokenization.text_field, tokenization.format)
    rows = load_token_set(source, tokenizer, tokenization, cache_dir)
    if eval_fraction is not None:
        return rows.hold_out(eval_fraction)
    if eval_data is not None:
        held = inspect_data(eval_data, tokenization.text_field, tokenization.format)
        return rows, load_token_set(held, tokenizer, tokenization, cache_dir)
    return rows, None
