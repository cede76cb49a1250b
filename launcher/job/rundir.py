"""The output folder of a run: what it holds, whether it belongs to this run, and starting over.

OUT/plan.json        the plan (the --json contract)       OUT/metrics.jsonl  one line per optimizer step
OUT/ds_config.json   what DeepSpeed reads                 OUT/checkpoints/   step<N>/ + complete.json
OUT/run_spec.json    what every rank reads                OUT/final/         save_pretrained + tokenizer
OUT/run.json         summary: predicted vs measured       OUT/cache/         tokenized, packed data
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from launcher.errors import UserInputError

RESULT_FILES = ("metrics.jsonl", "run.json")
SWAP_PREFIX = "offload-launch-"  # every run's folder under --nvme-path starts with this
SWAP_OWNER_FILE = "owner.json"  # in that folder: which output folder's run it belongs to
RESULT_DIRS = ("checkpoints", "final")


def default_output_dir(model_name: str) -> str:
    return str(Path("runs") / Path(model_name.rstrip("/")).name)


def swap_dir(nvme_path: str, output_dir: str) -> str:
    """This run's own folder under --nvme-path: stable across resumes of the same OUT, distinct between
    runs, so two runs sharing a drive never overwrite each other's swap files (FIELD-NOTES)."""
    digest = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return str(Path(nvme_path) / f"{SWAP_PREFIX}{digest}")


def run_swap_dir(plan, output_dir: str | Path) -> str | None:
    """The run's own swap folder when its strategy swaps to NVMe (under --nvme-path, else the described
    host's nvme.path); None otherwise."""
    strategy = plan.chosen.strategy
    if "nvme" not in (strategy.offload_optimizer, strategy.offload_param):
        return None
    return swap_dir(plan.workload.nvme_path or plan.host.nvme.path, str(output_dir))


def check_owner(output_dir: Path, model: str, data: str, force: bool) -> None:
    """An output folder that holds a different run (other model or data) is refused unless --force."""
    spec_path = output_dir / "run_spec.json"
    if force or not spec_path.exists():
        return
    try:
        previous = json.loads(spec_path.read_text())
    except (OSError, ValueError):
        return
    for key, value in (("model", model), ("data", data)):
        if previous.get(key) != value:
            raise UserInputError(
                f"{output_dir} holds a run of {key} {previous.get(key)!r}, not {value!r}; pass another "
                "--output-dir, or --force to reuse it"
            )


def check_not_a_training_run(output_dir: Path, force: bool) -> None:
    """--smoke starts its folder over: refuse one that holds a training run (its checkpoints and swap files
    would go) unless --force."""
    spec_path = output_dir / "run_spec.json"
    if force or not spec_path.exists():
        return
    try:
        smoke = json.loads(spec_path.read_text()).get("smoke", False)
    except (OSError, ValueError, AttributeError):
        return
    if not smoke:
        raise UserInputError(
            f"{output_dir} holds a training run, which a smoke test would erase; pass another --output-dir "
            "(the default is runs/<model>-smoke), or --force"
        )


def start_over(output_dir: Path) -> None:
    """--no-resume: drop the previous run's checkpoints, metrics, summary and export (not the data cache)."""
    for name in RESULT_FILES:
        (output_dir / name).unlink(missing_ok=True)
    for name in RESULT_DIRS:
        shutil.rmtree(output_dir / name, ignore_errors=True)
