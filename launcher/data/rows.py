"""The rows the ranks train on (blocks.py makes them): the arrays each row has, what a batch of them feeds the
model, the tokens it counts, the rows held out for the eval loss, and the rows saved to and read from the token
cache (`.npz`)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from launcher.drills import kill_point
from launcher.errors import UserInputError

PACKINGS = ("stream", "documents", "pad", "seq2seq")
IGNORE = -100  # the label transformers' losses skip
_ROW_ARRAYS = {  # what a TokenSet may hold, with its dtype
    "input_ids": np.int64,
    "loss_mask": np.bool_,  # causal: the token carries loss (absent: every token does)
    "position_ids": np.int32,  # documents: restarting at each document
    "attention_mask": np.bool_,  # pad and seq2seq: False on padding
    "labels": np.int64,  # seq2seq: the target, IGNORE on padding
}
_HELD_OUT_KEY = 0x5EED0E7A1  # fixes which rows --eval-fraction holds out, whatever --seed is


@dataclass(frozen=True)
class Tokenization:
    """How records become rows; part of the token cache's key, and written to run_spec.json for the ranks."""

    seq_len: int
    format: str = "text"  # formats.FORMATS
    text_field: str = "text"
    packing: str = "stream"  # PACKINGS
    train_on_prompt: bool = False
    chat_template: str | None = None  # --chat-template's text, which replaces the tokenizer's

    @property
    def seq2seq(self) -> bool:
        return self.packing == "seq2seq"


@dataclass
class TokenSet:
    """Rows of seq_len tokens and what goes with them (_ROW_ARRAYS); `stats` counts what tokenizing found."""

    arrays: dict[str, np.ndarray]
    stats: dict = field(default_factory=dict)  # records, skipped (nothing to train on), truncated (cut at seq_len)

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])

    @property
    def seq2seq(self) -> bool:
        return "labels" in self.arrays

    def inputs(self, rows) -> dict[str, np.ndarray]:
        """The model's keyword arguments for `rows` (a list of row indices), as int64 arrays."""
        ids = self.arrays["input_ids"][rows]
        out = {"input_ids": ids}
        if self.seq2seq:
            out["labels"] = self.arrays["labels"][rows]
        elif "loss_mask" in self.arrays:
            out["labels"] = np.where(self.arrays["loss_mask"][rows], ids, IGNORE)
        else:
            out["labels"] = ids.copy()  # its own array: a caller may ignore some rows' labels
        for name in ("position_ids", "attention_mask"):
            if name in self.arrays:
                out[name] = self.arrays[name][rows].astype(np.int64)
        return out

    def token_counts(self, rows=None) -> dict[str, int]:
        """count_tokens over `rows` (every row: None)."""
        return count_tokens(self.inputs(slice(None) if rows is None else rows), self.seq2seq)

    def digest(self) -> str:
        """The rows' contents (sha256 over every array, 16 hex digits): what the ranks train on, whatever the
        files' paths or times. Token ids alone hash as they did before the other arrays existed, so a run an
        earlier version streamed resumes."""
        sha = hashlib.sha256(np.ascontiguousarray(self.arrays["input_ids"]).data)
        for name in sorted(set(self.arrays) - {"input_ids"}):
            sha.update(name.encode())
            sha.update(np.ascontiguousarray(self.arrays[name]).data)
        return sha.hexdigest()[:16]

    def subset(self, rows: np.ndarray) -> TokenSet:
        return TokenSet({name: array[rows] for name, array in self.arrays.items()}, dict(self.stats))

    def hold_out(self, fraction: float) -> tuple[TokenSet, TokenSet]:
        """(training rows, held-out rows): ceil(fraction x rows) rows, at least one, chosen by a keyed hash of
        their index (sampling._mix64), so the same data always holds out the same rows and they are spread over
        the whole set. A document cut across two rows may have a part on each side."""
        from launcher.data.sampling import _mix64

        n = len(self)
        count = min(n - 1, max(1, int(np.ceil(fraction * n))))
        if count < 1:
            raise UserInputError(f"the data yields {n} row(s): too few to hold any out; add data or pass --eval-data")
        keys = _mix64(np.arange(n, dtype=np.uint64) ^ np.uint64(_HELD_OUT_KEY))
        held = np.zeros(n, bool)
        held[np.argsort(keys, kind="stable")[:count]] = True
        return self.subset(np.flatnonzero(~held)), self.subset(np.flatnonzero(held))


def count_tokens(inputs: Mapping, seq2seq: bool) -> dict[str, int]:
    """Tokens in a batch of model inputs (numpy or torch): `tokens` read (padding excluded), of them `trained`
    (predicted with loss: a causal LM's labels from the second position on, as the model shifts them; a seq2seq
    model's target) and `masked` (the rest: prompts, sources, each row's and document's first token);
    `padding`."""
    ids, labels = inputs["input_ids"], inputs["labels"]
    size = int(ids.shape[0]) * int(ids.shape[1])
    read = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else size
    if seq2seq:
        target = int((labels != IGNORE).sum())
        return {"tokens": read + target, "trained": target, "masked": read, "padding": 2 * size - read - target}
    trained = int((labels[:, 1:] != IGNORE).sum())
    return {"tokens": read, "trained": trained, "masked": read - trained, "padding": size - read}


def read_cache(path: Path, seq_len: int) -> TokenSet | None:
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files if name in _ROW_ARRAYS}
            stats = json.loads(str(saved["stats"])) if "stats" in saved.files else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, KeyError):
        return None  # unreadable (e.g. truncated by hand): rebuild it
    ids = arrays.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[1] != seq_len or len(ids) == 0:
        return None
    if any(a.dtype != _ROW_ARRAYS[name] or a.shape != ids.shape for name, a in arrays.items()):
        return None
    return TokenSet(arrays, stats)


def write_cache(path: Path, token_set: TokenSet) -> None:
    """`token_set` saved at `path`: into a temporary file named for this process, renamed into place once whole
    (a reader never sees a partial cache). A temporary file whose writer died (a SIGKILL mid-write: the drill
    `tokenize:0` fires before the rename) is removed by the next writer."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphaned_temporaries(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.{os.getpid()}.", suffix=".tmp")
    except OSError as exc:
        raise UserInputError(
            f"cannot write the token cache in {path.parent} ({exc.strerror}); use a writable folder"
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **token_set.arrays, stats=np.array(json.dumps(token_set.stats)))
            handle.flush()
            os.fsync(handle.fileno())
        kill_point("tokenize", 0)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_orphaned_temporaries(path: Path) -> None:
    """The temporary files of `path` (.STEM.PID.XXXX.tmp) whose writing process is gone."""
    for tmp in path.parent.glob(f".{path.stem}.*.tmp"):
        pid = tmp.name[len(path.stem) + 2 :].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
