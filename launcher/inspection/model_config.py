"""Model configs: resolve `--model` to a Hugging Face config.json, read it as transformers does, and cut it to
fewer layers (model.py counts the model it describes).

Resolution order for a hub id (the issue's contract): the hub itself (config.json only, a few seconds at
most), then the local Hugging Face cache, then the configs bundled in `launcher/models/`. A local
directory must hold a `config.json`; weights are optional (planning never reads them).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from launcher.errors import UserInputError
from launcher.resources import resource_path

BUNDLED_DIR = resource_path("models")
HUB_TIMEOUT_SECONDS = 5.0


# ---------------------------------------------------------------------------------------------- resolve


def bundled_aliases() -> dict[str, str]:
    path = BUNDLED_DIR / "aliases.json"
    return json.loads(path.read_text()) if path.exists() else {}


def bundled_ids() -> list[str]:
    return sorted(p.stem.replace("--", "/") for p in BUNDLED_DIR.glob("*.json") if p.name != "aliases.json")


def _looks_like_path(spec: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else (./x, /x, ~/x, a/b/c, x/) is meant as a path."""
    return spec.startswith((".", "/", "~")) or spec.endswith("/") or spec.count("/") > 1


def _hub_reachable(timeout: float) -> bool:
    """A TCP connect to the hub endpoint: answers in `timeout` seconds where huggingface_hub's own retries
    would take ~25 s to give up on a machine without network."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_config(repo_id: str, timeout: float) -> tuple[Path | None, str]:
    """(directory holding config.json, note). Hub first when reachable, else the local HF cache."""
    from huggingface_hub import hf_hub_download

    note = ""
    if _hub_reachable(timeout):
        result: dict[str, object] = {}

        def fetch() -> None:
            try:
                result["path"] = hf_hub_download(repo_id, "config.json", etag_timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - any hub failure falls back to cache / bundled
                result["error"] = exc

        worker = threading.Thread(target=fetch, daemon=True)
        worker.start()
        worker.join(timeout * 2)
        if "path" in result:
            return Path(str(result["path"])).parent, ""
        error = result.get("error")
        note = f"hub did not answer for {repo_id} ({type(error).__name__ if error else 'timeout'})"
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=True)
        return Path(path).parent, note
    except Exception:  # noqa: BLE001 - not in cache
        return None, note


def resolve_config_dir(spec: str, *, hub_timeout: float = HUB_TIMEOUT_SECONDS) -> tuple[Path, str, str]:
    """(directory with config.json, source, canonical name) for a local path or hub id."""
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.name.endswith(".json"):
            path = path.parent
        if not path.is_dir():
            raise UserInputError(f"--model {spec}: not a directory; pass a folder holding a Hugging Face config.json")
        if not (path / "config.json").is_file():
            raise UserInputError(
                f"no config.json in {spec}; pass a directory holding a Hugging Face config, or a hub id"
            )
        return path, "local", spec
    if _looks_like_path(spec):
        raise UserInputError(f"model path {spec} does not exist; pass an existing directory or a hub id (org/name)")

    aliases = bundled_aliases()
    repo_id = aliases.get(spec, spec)
    hub_dir, note = _hub_config(repo_id, hub_timeout)
    if hub_dir is not None:
        return hub_dir, ("hf-cache" if note else "hub"), repo_id
    bundled = BUNDLED_DIR / (repo_id.replace("/", "--") + ".json")
    if bundled.is_file():
        return bundled, "bundled", repo_id
    known = ", ".join(bundled_ids())
    raise UserInputError(
        f"unknown model '{spec}': not a local directory, not reachable on the hub ({note or 'offline'}), "
        f"not in the Hugging Face cache, and not bundled; check the id, go online to fetch its config, or pass "
        f"a local directory holding config.json; bundled ids: {known}"
    )


# ------------------------------------------------------------------------------------------------- read


def _read_config_dict(config_path: Path) -> dict:
    try:
        data = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise UserInputError(f"malformed {config_path}: {exc.msg} at line {exc.lineno}; fix the JSON") from None
    if not isinstance(data, dict):
        raise UserInputError(
            f"malformed {config_path}: expected a JSON object of config keys, got a {type(data).__name__}; "
            "pass a Hugging Face model config"
        )
    return data


def load_config(location: Path, trust_remote_code: bool):
    """A transformers PretrainedConfig from a config.json file or a directory holding one."""
    from transformers import AutoConfig

    config_file = location if location.is_file() else location / "config.json"
    data = _read_config_dict(config_file)
    model_type = data.get("model_type")
    if not model_type:
        raise UserInputError(
            f"{config_file} has no 'model_type', so transformers cannot tell the architecture; add it "
            '(e.g. "model_type": "llama") or pass a Hugging Face model config'
        )
    try:
        if location.is_file():
            return AutoConfig.for_model(**data)
        return AutoConfig.from_pretrained(str(location), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        if "trust_remote_code" in str(exc) or "auto_map" in data:
            raise UserInputError(
                f"architecture '{model_type}' needs the model's own code; rerun with --trust-remote-code "
                "if you trust its source"
            ) from None
        raise UserInputError(
            f"{config_file}: model_type '{model_type}' is not one transformers {transformers_release()} knows; "
            "upgrade transformers, or pass --trust-remote-code if the model ships its own code"
        ) from None


def transformers_release() -> str:
    """The installed transformers' major.minor ("5.24"), for messages."""
    from importlib.metadata import version

    return ".".join(version("transformers").split(".")[:2])


# an encoder-decoder config's decoder depth (T5: num_decoder_layers; BART and its kin: decoder_layers);
# num_hidden_layers is the encoder's there
DECODER_DEPTH_KEYS = ("num_decoder_layers", "decoder_layers")


def cut_to_layers(config, layers: int) -> None:
    """Cut a transformers config to its first `layers` transformer blocks, in place: num_hidden_layers, every
    per-layer list (e.g. Qwen's `layer_types`) and max_window_layers; an encoder-decoder's decoder stack to
    its first `layers` blocks too."""
    full = config.num_hidden_layers
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == full and key != "architectures":
            setattr(config, key, value[:layers])
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "max_window_layers", None), int):
        config.max_window_layers = min(config.max_window_layers, layers)
    if getattr(config, "is_encoder_decoder", False):
        for key in DECODER_DEPTH_KEYS:
            if isinstance(getattr(config, key, None), int):
                setattr(config, key, min(getattr(config, key), layers))
