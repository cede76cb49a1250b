"""Domain errors. The core raises these; only the CLI turns them into exit codes and one-line messages."""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3


class OffloadLaunchError(Exception):
    """Base class: a problem the user can fix. `str(err)` is the one line shown to them."""

    exit_code = EXIT_BAD_INPUT


class UserInputError(OffloadLaunchError):
    """A flag, file or described host is wrong (exit code 2)."""


class DoesNotFit(OffloadLaunchError):
    """No candidate strategy fits the host (exit code 3). Carries the plan so the table can be shown."""

    exit_code = EXIT_DOES_NOT_FIT

    def __init__(self, message: str, plan: object = None):
        super().__init__(message)
        self.plan = plan


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The valid spelling `word` was most likely meant to be, for 'did you mean' hints; None when no choice is
    a close spelling, and the caller lists the valid ones instead.

    A hint is only worth showing when it is what the user meant to type: a wrong hint ('pad' -> 'wandb', as
    difflib's ratio >= 0.5 gave) sends them to the wrong key, where the full list would have let them find
    the right one. So the rule is spelling distance, not similarity ratio. Both words are first normalized
    (case folded, the separators _ - . and spaces dropped: fp_16 is fp16, Zero-Optimization is
    zero_optimization), then a choice is close when either
      * the optimal-string-alignment distance (insert, delete, substitute, swap two neighbours) is at most 0
        for a word of 1-2 characters, 1 for 3-5 and 2 for longer ones: a typo or two (zero_optimisation,
        gradient_acumulation_steps, tiny-dmeo), never a different short word (lr, pad, foo, xyz); or
      * one is a prefix of the other, the shorter has at least 4 characters and half the longer's: a
        dropped or added trailing word (train_batch -> train_batch_size, stage3_prefetch_bucket,
        seq_length -> seq_len), not a bare stem (zero -> zero_optimization); and a word that begins
        several choices names none of them (offload: offload_param or offload_optimizer?).
    The closest (fewest edits; a prefix counts its missing characters) wins, the first listed on a tie.
    """
    target = _normalized(word)
    if not target:
        return None
    spelled = {choice: _normalized(choice) for choice in choices}
    stem_of_one = sum(s.startswith(target) and s != target for s in spelled.values()) == 1
    budget = 0 if len(target) <= 2 else 1 if len(target) <= 5 else 2
    best: tuple[int, str] | None = None
    for choice, spelling in spelled.items():
        distance = _close(target, spelling, budget, stem_ok=stem_of_one)
        if distance is not None and (best is None or distance < best[0]):
            best = (distance, choice)
    return best[1] if best else None


_SEPARATORS = str.maketrans("", "", "_-. ")


def _normalized(word: str) -> str:
    return word.casefold().translate(_SEPARATORS)


def _close(word: str, choice: str, budget: int, *, stem_ok: bool) -> int | None:
    """The edits from `word` to `choice` when they are close by `nearest`'s rule, else None."""
    short, long = sorted((word, choice), key=len)
    prefix = long.startswith(short) and len(short) >= 4 and 2 * len(short) >= len(long)
    if prefix and (stem_ok or short == choice):
        return len(long) - len(short)
    if len(long) - len(short) > budget:  # also keeps the quadratic distance off long garbage keys
        return None
    distance = _osa_distance(word, choice)
    return distance if distance <= budget else None


def _osa_distance(a: str, b: str) -> int:
    """Levenshtein distance that also counts swapping two neighbouring characters as one edit."""
    before, previous = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if before is not None and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, previous = previous, current
    return previous[-1]


def unknown_key_message(key: str, choices: Iterable[str], where: str) -> str:
    choices = sorted(choices)
    hint = nearest(key, choices)
    tail = f"did you mean '{hint}'?" if hint else f"valid keys: {', '.join(choices)}"
    shown = f"'{key}'" if key.isprintable() else repr(key)  # a key holding a newline stays on one line
    return f"unknown key {shown} in {where}; {tail}"


class Stopped(OffloadLaunchError):
    """A run that stopped for a reason with its own exit code: a host limit (2 or 3), a failed smoke check
    (10-18), or the training processes' own exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
