"""Sizes and rates with units: parse what people write ("80GiB", "4TB", "25GB/s"), print what they read."""

from __future__ import annotations

import math
import re

from launcher.errors import UserInputError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    # single-letter suffixes (as in `df -h` / k8s) are binary
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GiB = 2**30
GB = 10**9


def parse_size(value: object, what: str, *, per_second: bool = False) -> int:
    """Bytes (or bytes/s when `per_second`) from an int or a string with a unit. Errors name `what`."""
    if isinstance(value, bool):
        raise UserInputError(f"{what}: expected a size such as '80GiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UserInputError(f"{what}: size must not be negative, got {value}")
        return value
    if isinstance(value, float):
        raise UserInputError(
            f"{what}: a bare number {value!r} has no unit; write it as a string with a unit, e.g. '{value}GB'"
        )
    if not isinstance(value, str):
        raise UserInputError(f"{what}: expected a size such as '80GiB', got {value!r}")
    text = value.strip()
    if per_second:
        if not re.search(r"/\s*s$", text, re.IGNORECASE):
            raise UserInputError(f"{what}: a bandwidth needs '/s', e.g. '25GB/s', got {value!r}")
        text = re.sub(r"/\s*s$", "", text, flags=re.IGNORECASE)
    if text.startswith("-"):
        raise UserInputError(f"{what}: size must not be negative, got {value!r}")
    match = _SIZE_RE.match(text)
    if not match:
        raise UserInputError(f"{what}: cannot read {value!r} as a size; write e.g. '80GiB', '4TB' or 1073741824")
    number, unit = match.groups()
    if unit.lower() not in _UNITS:
        raise UserInputError(f"{what}: unknown unit '{unit}' in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    if unit == "" and "." in number:
        raise UserInputError(f"{what}: {value!r} has no unit; write e.g. '{number}GB'")
    size = float(number) * _UNITS[unit.lower()]
    if not math.isfinite(size):
        raise UserInputError(f"{what}: {value!r} is too large to be a size")
    return int(round(size))


def fmt_bytes(n: int | float) -> str:
    """Human size in binary units, e.g. 14.0 GiB. Bytes stay integers everywhere else."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_count(n: int) -> str:
    """Parameter counts: 6,738,415,616 (6.74 B)."""
    if n >= 10**9:
        short = f"{n / 1e9:.2f} B"
    elif n >= 10**6:
        short = f"{n / 1e6:.1f} M"
    else:
        return f"{n:,}"
    return f"{n:,} ({short})"
