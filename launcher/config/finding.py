"""One lint finding: a level, the JSON path it is about, and a one-line message (lint.py, lint_modes.py and
lint_partial.py make them; `check` and `--ds-config` print them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    # "error": DeepSpeed refuses it or misreads it; "warning": it accepts it and silently does not do what it says;
    # "note": it reads the value differently from how it is written (1e9 in an integer field as 1000000000)
    level: str
    path: str  # JSON path such as "zero_optimization.offload_param.buffer_size"; "" = the whole config
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.path}: {self.message}" if self.path else f"{self.level}: {self.message}"

    def to_json(self) -> dict:
        return asdict(self)
