"""One lint finding: a level, the JSON path it is about, and a one-line message (lint.py and lint_modes.py make
them; `check` and `--ds-config` print them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    path: str  # JSON path such as "zero_optimization.offload_param.buffer_size"; "" = the whole config
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.path}: {self.message}" if self.path else f"{self.level}: {self.message}"

    def to_json(self) -> dict:
        return asdict(self)
