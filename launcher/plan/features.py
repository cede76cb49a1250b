"""DeepSpeed features the plan uses beyond the 2021 strategies, by the first release that has them. The planner
proposes a feature only where the installed DeepSpeed has it, and a setting that asks for one it lacks is refused
in one line (`require`). Pure: the version is passed in (job/planning.installed_deepspeed_version reads it).
"""

from __future__ import annotations

import re

from launcher.errors import UserInputError

# feature -> (first DeepSpeed release with it, what it is, where it came from)
MINIMUM: dict[str, tuple[tuple[int, int, int], str]] = {
    # Twin-Flow: offload_optimizer.ratio (PR 4636, merged 2023-11-06, first released in 0.12.4)
    "offload_ratio": ((0, 12, 4), "partial optimizer offload (offload_optimizer.ratio)"),
    # ZenFlow: stage 1/2 in PR 7391 (2025-07), stage 3 in PR 7516 (2025-09): taken from 0.18.0, the first release
    # with both
    "zenflow": ((0, 18, 0), "ZenFlow (zero_optimization.zenflow)"),
    # SuperOffload: offload_optimizer.super_offload (its blog and PR 7612, 2025-09; taken from 0.18.0)
    "super_offload": ((0, 18, 0), "SuperOffload (offload_optimizer.super_offload)"),
    # bf16_optimizer_states together with offload_optimizer (PR 8010, 2026-05; 0.19.1)
    "bf16_optimizer_states": ((0, 19, 1), "16-bit optimizer states with CPU offload"),
}


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of "0.19.8", "0.19.8+cu128", "0.20.0rc1"; None when unreadable."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    return tuple(int(part or 0) for part in match.groups()) if match else None


def supports(feature: str, version: tuple[int, int, int] | None) -> bool:
    """Whether DeepSpeed `version` has `feature`; an unknown version (None) is taken to have it: the ds_config
    is validated against the installed DeepSpeed's own models before anything runs."""
    return version is None or version >= MINIMUM[feature][0]


def require(feature: str, version: tuple[int, int, int] | None, flag: str) -> None:
    """A one-line refusal when a setting asks for what the installed DeepSpeed lacks."""
    if not supports(feature, version):
        first, what = MINIMUM[feature]
        have = ".".join(map(str, version))
        raise UserInputError(
            f"{flag} needs DeepSpeed >= {'.'.join(map(str, first))} for {what}; this one is {have}: "
            "pip install -U deepspeed"
        )
