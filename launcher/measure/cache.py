"""Measured results on disk: the probe by host id, the passes by model shape, in the tool's cache folder.

The formats are the measurements' own JSON (ProbeResult.to_json(); the passes' dict), written atomically: a reader
never sees half a file, and a damaged or foreign file reads as "not measured yet"."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from launcher.files import write_json_atomic
from launcher.measure.passes import CUT_LAYERS, ESTIMATOR


def probe_path(tool_cache_dir: Path) -> Path:
    return tool_cache_dir / "probe.json"


def load_probe(path: Path, current_host_id: str) -> dict | None:
    """The cached probe (ProbeResult.to_json()) of the host `current_host_id`; None for another host's or none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("host_id") != current_host_id or "figures" not in data:
        return None
    # ProbeResult's fields in its order: a probe saved again (job/measuring.with_zero_costs) keeps its layout
    return {
        "host_id": data["host_id"],
        "date": data.get("date", ""),
        "figures": data["figures"],
        "aio": data.get("aio", {}),
        "details": data.get("details", {}),
    }


def save_probe(data: dict, path: Path) -> None:
    write_json_atomic(path, data)


def passes_key(
    config: dict, *, host_id: str, device: str, threads: int, tokens: tuple[int, int], recompute: bool
) -> str:
    """The passes' identity: the model's config, the host, the device and threads a rank gets, (micro-batch,
    sequence length), recomputation, torch's version (from its metadata, as torch.__version__ reads for a wheel:
    a plan does not import torch), the cuts and the estimator."""
    from importlib.metadata import version

    identity = json.dumps(
        [
            config,
            host_id,
            device,
            threads,
            list(tokens),
            recompute,
            version("torch"),
            CUT_LAYERS,
            ESTIMATOR,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def passes_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / "passes" / f"{key}.json"


def load_passes(cache_dir: Path, key: str) -> dict | None:
    """The cached passes under `key`; None when not cached yet or damaged (then measured again)."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(passes_path(cache_dir, key).read_text())
    return None


def save_passes(cache_dir: Path, key: str, result: dict) -> None:
    write_json_atomic(passes_path(cache_dir, key), result)
