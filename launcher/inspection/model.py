"""Model inspection: resolve `--model` to a Hugging Face config, build it on the meta device, count exactly.

Resolution order for a hub id (the issue's contract): the hub itself (config.json only, a few seconds at
most), then the local Hugging Face cache, then the configs bundled in `launcher/models/`. A local
directory must hold a `config.json`; weights are optional (planning never reads them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

from launcher.errors import UserInputError
from launcher.files import write_json_atomic
from launcher.resources import resource_path

BUNDLED_DIR = resource_path("models")
SHIPPED_PROFILES_DIR = BUNDLED_DIR / "profiles"  # the bundled configs, counted: scripts/count_bundled_models.py
HUB_TIMEOUT_SECONDS = 5.0
PROFILE_VERSION = 3  # bump when ModelProfile's fields change: cached profiles are keyed by it
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
_LAYER_RE = re.compile(r"\.layers?\.(\d+)\.|\.h\.(\d+)\.|\.blocks?\.(\d+)\.")


@dataclass(frozen=True)
class ModelProfile:
    """What the planner needs to know about a model. Counts are exact (meta-device build)."""

    name: str  # what the user passed
    source: str  # "local" | "hub" | "hf-cache" | "bundled"
    config_dir: str  # directory holding the config.json that was read
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama"
    params: int  # total parameters, tied weights once
    largest_param_numel: int  # elements in the largest single tensor
    largest_param_name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    layer_params: int  # parameters of the largest transformer block
    # every tensor's numel in model.parameters() order: persistence thresholds sum them, and ZeRO-3 forms its
    # optimizer sub-groups in this order (memory.stage3_subgroups)
    param_numels: tuple[int, ...]
    tied_embeddings: bool
    has_weights: bool  # the directory also holds weight files
    input_embedding_numel: int = 0  # the token embedding table: a lookup, no matmul FLOPs

    @property
    def compute_params(self) -> int:
        """Parameters that do matmul work per token: all but an untied input embedding (Kaplan et al. 2020
        count C = 6·N with N the non-embedding parameters; a tied table still works as the lm_head)."""
        return self.params - (0 if self.tied_embeddings else self.input_embedding_numel)

    def params_below(self, threshold: int) -> int:
        """Elements in tensors smaller than `threshold` (ZeRO-3 keeps these resident, unpartitioned)."""
        return sum(n for n in self.param_numels if n < threshold)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "params": self.params,
            "largest_param_numel": self.largest_param_numel,
            "largest_param_name": self.largest_param_name,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_params": self.layer_params,
            "tied_embeddings": self.tied_embeddings,
            "has_weights": self.has_weights,
        }


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


# ---------------------------------------------------------------------------------------------- inspect


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
            f"transformers does not know model_type '{model_type}' in {config_file}; upgrade transformers, "
            "or pass --trust-remote-code if the model ships its own code"
        ) from None


def cut_to_layers(config, layers: int) -> None:
    """Cut a transformers config to its first `layers` transformer blocks, in place: num_hidden_layers, every
    per-layer list (e.g. Qwen's `layer_types`) and max_window_layers."""
    full = config.num_hidden_layers
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == full and key != "architectures":
            setattr(config, key, value[:layers])
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "max_window_layers", None), int):
        config.max_window_layers = min(config.max_window_layers, layers)


def _count_on_meta(config, trust_remote_code: bool) -> tuple[list[tuple[str, int]], bool, str, int]:
    """Every (name, numel) of the model built on PyTorch's meta device: exact, instant, no memory.
    `named_parameters()` yields a shared (tied) tensor once."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        name = getattr(config, "model_type", "?")
        raise UserInputError(
            f"cannot build a causal LM for model_type '{name}' ({exc}); pass --trust-remote-code if the "
            "model ships its own code"
        ) from None
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    tied = False
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is not None and in_emb is not None:
        tied = out_emb.weight is in_emb.weight
    embedding = in_emb.weight.numel() if in_emb is not None else 0
    return named, tied, type(model).__name__, embedding


def _first(config, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def profile_file_name(location: Path, trust_remote_code: bool) -> str:
    """Profiles are keyed by the config's bytes and the transformers version that counted them."""
    from importlib.metadata import version

    config_file = location if location.is_file() else location / "config.json"
    key = hashlib.sha256(
        config_file.read_bytes() + f"|{version('transformers')}|{trust_remote_code}|{PROFILE_VERSION}".encode()
    )
    return f"{key.hexdigest()[:32]}.json"


def inspect_model(
    spec: str,
    *,
    trust_remote_code: bool = False,
    hub_timeout: float = HUB_TIMEOUT_SECONDS,
    cache_dir: Path | None = None,
) -> ModelProfile:
    """Resolve and count `spec`. With `cache_dir`, a config counted before (same config bytes, same transformers
    version) is read back instead of built again, so the plan skips importing transformers: from the tool cache,
    or from the profiles shipped for the bundled configs (counted under the transformers the tool is tested with;
    under another version the names differ and the model is counted here)."""
    location, source, name = resolve_config_dir(spec, hub_timeout=hub_timeout)
    if cache_dir is None:
        return _inspect(location, source, name, trust_remote_code)
    file_name = profile_file_name(location, trust_remote_code)
    cache_file = cache_dir / "profiles" / file_name
    for counted in (cache_file, SHIPPED_PROFILES_DIR / file_name):
        profile = _read_profile(counted, location, source, name)
        if profile is not None:
            return profile
    profile = _inspect(location, source, name, trust_remote_code)
    write_json_atomic(cache_file, asdict(profile))
    return profile


def _read_profile(path: Path, location: Path, source: str, name: str) -> ModelProfile | None:
    """A profile counted before, as this resolution names and finds it; None when there is none (or unreadable)."""
    if not path.is_file():
        return None
    with contextlib.suppress(ValueError, TypeError, KeyError):
        data = json.loads(path.read_text())
        data.update(name=name, source=source, config_dir=str(location), param_numels=tuple(data["param_numels"]))
        data["has_weights"] = source == "local" and any(any(location.glob(p)) for p in _WEIGHT_PATTERNS)
        return ModelProfile(**data)
    return None


def count_bundled_models() -> dict[str, dict]:
    """{profile file name: profile} for every bundled config, counted now on the meta device; what
    SHIPPED_PROFILES_DIR holds (scripts/count_bundled_models.py writes it, a test compares the two)."""
    counted = {}
    for model_id in bundled_ids():
        config_file = BUNDLED_DIR / (model_id.replace("/", "--") + ".json")
        profile = _inspect(config_file, "bundled", model_id, trust_remote_code=False)
        shipped = replace(profile, config_dir=config_file.relative_to(BUNDLED_DIR.parent).as_posix())
        counted[profile_file_name(config_file, trust_remote_code=False)] = asdict(shipped)
    return counted


def _inspect(location: Path, source: str, name: str, trust_remote_code: bool) -> ModelProfile:
    config = load_config(location, trust_remote_code)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    named, tied, architecture, embedding = _count_on_meta(config, trust_remote_code)
    if not named:
        raise UserInputError(f"model '{name}' has no parameters")
    largest_name, largest = max(named, key=lambda item: item[1])

    per_layer: dict[int, int] = {}
    for param_name, numel in named:
        match = _LAYER_RE.search("." + param_name)
        if match:
            index = int(next(g for g in match.groups() if g is not None))
            per_layer[index] = per_layer.get(index, 0) + numel
    num_layers = _first(text_config, "num_hidden_layers", "n_layer", "num_layers", default=len(per_layer))
    hidden = _first(text_config, "hidden_size", "n_embd", "d_model")
    heads = _first(text_config, "num_attention_heads", "n_head")
    intermediate = _first(text_config, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    has_weights = location.is_dir() and any(any(location.glob(p)) for p in _WEIGHT_PATTERNS)
    return ModelProfile(
        name=name,
        source=source,
        config_dir=str(location),
        architecture=architecture,
        model_type=config.model_type,
        params=sum(n for _, n in named),
        largest_param_numel=largest,
        largest_param_name=largest_name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        vocab_size=_first(text_config, "vocab_size"),
        max_position_embeddings=_first(text_config, "max_position_embeddings", "n_positions", "max_seq_len"),
        layer_params=max(per_layer.values(), default=0),
        param_numels=tuple(n for _, n in named),
        tied_embeddings=tied,
        has_weights=has_weights and source == "local",
        input_embedding_numel=embedding,
    )
