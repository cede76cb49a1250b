"""The one path from a plan (and the user's own ds_config, if any) to the validated ds_config a run uses.

`final_config()` renders the plan (templates/), merges the user's --ds-config over it ("auto" values filled
from the plan, linted against it: the first error refused, warnings returned), points NVMe offload at the
run's own swap folder, and validates the result against the JSON Schema and DeepSpeed's own models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher import textfiles
from launcher.config import dsconfig
from launcher.errors import UserInputError
from launcher.plan.planner import Plan

OFFLOAD_SECTIONS = ("offload_optimizer", "offload_param")
# DeepSpeed's own configs nest 6 levels at most (compression_training.weight_quantization.different_groups.
# wq1.params.start_bits); deeper is a broken file, refused before the merge, lint and schema recurse into it.
MAX_DEPTH = 32
DUPLICATE_FIX = (
    "DeepSpeed refuses a ds_config with a duplicate key (plain json.load keeps the last one silently); "
    "keep one, merged if both are sections"
)


@dataclass(frozen=True)
class UserConfig:
    """A user's ds_config (--ds-config) and the file it came from (for messages)."""

    path: str
    config: dict
    duplicates: tuple[textfiles.DuplicateKey, ...] = ()  # keys set twice (json keeps the last); `check` lists them


@dataclass(frozen=True)
class FinalConfig:
    config: dict
    # lint warnings about the user's config, each starting with its file name; its notes (a value DeepSpeed reads
    # differently from how it is written, 1e9 as 1000000000) are `check`'s: the config written says the integer
    warnings: tuple[str, ...]


def read_user_config(path: str, *, duplicates_ok: bool = False) -> UserConfig:
    """A user's ds_config file (JSON), or a one-line error naming the file and the line. A key set twice at
    any depth is such an error, as DeepSpeed refuses the file, unless `duplicates_ok` (`check` reports each
    one as a finding and lints the rest)."""
    try:
        text = textfiles.read_text(path)
    except OSError as exc:
        raise UserInputError(f"--ds-config {path}: {exc.strerror}; pass an existing ds_config JSON file") from None
    document = textfiles.parse_json(text, path, max_depth=MAX_DEPTH)
    config = document.value
    if not isinstance(config, dict):
        raise UserInputError(f"{path}: a ds_config is a JSON object, got a {type(config).__name__}")
    if document.duplicates and not duplicates_ok:
        first, more = document.duplicates[0], len(document.duplicates) - 1
        others = f" (and {more} more: run offload-launch check on it)" if more else ""
        raise UserInputError(f"{path}:{first.lines[1]}: {first}{others}; {DUPLICATE_FIX}")
    return UserConfig(path, config, document.duplicates)


def user_pins(user: UserConfig | None) -> dict:
    """The settings the user's ds_config fixes (ZeRO stage, offload devices, batch), as setting values."""
    if user is None:
        return {}
    from launcher.config.merge import pins_from_config

    return pins_from_config(user.config)


def final_config(
    plan: Plan,
    user: UserConfig | None = None,
    *,
    swap_dir: str | None = None,
    cache_dir: Path | None = None,
    node_local: bool = False,
) -> FinalConfig:
    """The ds_config for `plan`: generated, or the user's with its "auto" values filled from the generated one;
    NVMe offload swaps into `swap_dir` (the run's own folder on the drive); `node_local` (--node-local-checkpoints):
    each node's first rank also writes the model's states, so that every node's folder can be loaded alone
    (DeepSpeed's checkpoint.use_node_local_storage: engine.py saves the non-ZeRO states on local rank 0); validated."""
    config = dsconfig.render(plan, nvme_path=swap_dir)
    warnings: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    if user is not None:
        from launcher.config.lint import ignored_paths
        from launcher.config.merge import apply_user_config

        config, findings = apply_user_config(user.config, config, plan)
        warnings = tuple(f"{user.path}: {finding}" for finding in findings if finding.level == "warning")
        ignored = tuple(ignored_paths(config))  # warned about above; the schema refuses them on purpose
        for section in OFFLOAD_SECTIONS:  # the user's nvme_path names the drive; the run swaps into its own folder
            offload = config.get("zero_optimization", {}).get(section, {})
            if swap_dir and offload.get("device") == "nvme":
                offload["nvme_path"] = swap_dir
    if node_local:
        config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    dsconfig.validate(config, plan.world_size, cache_dir=cache_dir, ignored=ignored)
    return FinalConfig(config, warnings)
