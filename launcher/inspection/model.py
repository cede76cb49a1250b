"""Model inspection: build a model on the meta device from its config and count it exactly into a ModelProfile
(model_config.py resolves `--model` to that config and reads it).

Any model transformers can build from its config is counted (model_kind): a causal LM as AutoModelForCausalLM
builds it (Llama, GPT-2, ...), an encoder-decoder as AutoModelForSeq2SeqLM (T5, BART, ...: both stacks, the shared
embedding once), anything else as AutoModel, without a head (BERT: BertModel).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from launcher.errors import UserInputError
from launcher.files import write_json_atomic
from launcher.inspection.model_config import (
    BUNDLED_DIR,
    HUB_TIMEOUT_SECONDS,
    bundled_ids,
    load_config,
    resolve_config_dir,
    transformers_release,
)

SHIPPED_PROFILES_DIR = BUNDLED_DIR / "profiles"  # the bundled configs, counted: scripts/count_bundled_models.py
PROFILE_VERSION = 5  # bump when ModelProfile's fields change: cached profiles are keyed by it
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
_LAYER_RE = re.compile(r"\.layers?\.(\d+)\.|\.h\.(\d+)\.|\.blocks?\.(\d+)\.")
# ModelProfile.kind: how transformers builds the model, and so what the planner and the trainer make of it
CAUSAL_LM, SEQ2SEQ_LM, OTHER = "causal-lm", "seq2seq-lm", "other"
KINDS = (CAUSAL_LM, SEQ2SEQ_LM, OTHER)
# the transformers auto class each kind is built with (and auto_map's key for a model that ships its own code)
AUTO_CLASSES = {CAUSAL_LM: "AutoModelForCausalLM", SEQ2SEQ_LM: "AutoModelForSeq2SeqLM", OTHER: "AutoModel"}


class OptimizedCounts:
    """What the optimizer owns, for a ModelProfile and the planner's ModelShape alike (both have `params`,
    `param_numels`, `largest_param_numel`, `trainable_params` and `trainable_numels`): with an adapter
    (plan/adapters.py) its parameters, else all of them."""

    @property
    def optimized_params(self) -> int:
        """The parameters with gradients, fp32 masters and Adam states."""
        return self.trainable_params or self.params

    @property
    def optimized_numels(self) -> tuple[int, ...]:
        """Their tensors' numels, in the order ZeRO-3 forms its optimizer sub-groups (and ZeRO-1/2's per-parameter
        buffers)."""
        return self.trainable_numels if self.trainable_params else self.param_numels

    @property
    def largest_optimized_numel(self) -> int:
        """The largest tensor the optimizer owns."""
        return max(self.trainable_numels) if self.trainable_params else self.largest_param_numel


@dataclass(frozen=True)
class ModelProfile(OptimizedCounts):
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
    # optimizer sub-groups in this order (subgroups.stage3_subgroups)
    param_numels: tuple[int, ...]
    tied_embeddings: bool
    has_weights: bool  # the directory also holds weight files
    input_embedding_numel: int = 0  # the token embedding table: a lookup, no matmul FLOPs
    kind: str = CAUSAL_LM  # one of KINDS (model_kind): the auto class it is built, counted and trained with
    # An encoder-decoder's decoder blocks, each with a cross-attention over the encoder's output; num_layers counts
    # both stacks (T5-11B: 24 encoder + 24 decoder blocks = 48). 0: one stack (causal LMs, encoders).
    cross_attention_layers: int = 0
    # heads x head_dim where that differs from hidden_size (T5-11B: 128 x 128 = 16,384 against d_model 1,024): the
    # width the attention scores are computed at (timing [Narayanan], memory [Korth]); 0: hidden_size
    attention_width: int = 0
    # the checkpoint's dtype as its config.json states it ("bfloat16", "float32", ...; "" when it does not say):
    # loaded in another dtype, every rank holds a converted copy (plan/peaks.py [HF-load])
    weights_dtype: str = ""
    # every linear layer by its leaf name and shape: (leaf name, in features, out features, how many), in the order
    # first met - what a LoRA targets (plan/adapters.py); nn.Linear and transformers' Conv1D (GPT-2) alike
    linear_modules: tuple[tuple[str, int, int, int], ...] = ()
    output_embedding: str = ""  # the output embedding's leaf name ("lm_head"): LoRA's "all-linear" leaves it out
    # With an adapter (plan/adapters.adapted): the parameters the optimizer owns and their tensors' numels; the
    # frozen base is the rest of `params`. 0 and (): every parameter trains (full fine-tuning).
    trainable_params: int = 0
    trainable_numels: tuple[int, ...] = ()
    adapter_saved_bytes_per_token: int = 0  # plan/adapters.py [LoRA-act], all adapted layers

    @property
    def encoder_layers(self) -> int:
        """An encoder-decoder's encoder blocks (0 for one stack)."""
        return self.num_layers - self.cross_attention_layers if self.cross_attention_layers else 0

    @property
    def attention_dim(self) -> int:
        """The attention's inner width: heads x head_dim."""
        return self.attention_width or self.hidden_size

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
            "kind": self.kind,
            "cross_attention_layers": self.cross_attention_layers,
            "attention_dim": self.attention_dim,
            "weights_dtype": self.weights_dtype,
            "trainable_params": self.optimized_params,
        }


# ------------------------------------------------------------------------------------------------ kinds


def model_kind(config, trust_remote_code: bool = False) -> str:
    """ModelProfile.kind of a transformers config, from transformers' own auto-class mappings (for a model that
    ships its own code, from its config's auto_map):

    - "seq2seq-lm": an encoder-decoder (config.is_encoder_decoder) that AutoModelForSeq2SeqLM builds (T5, BART).
      BART's type is in the causal-LM mapping too, for BartForCausalLM, its decoder alone.
    - "causal-lm": AutoModelForCausalLM builds it, and it is not a bidirectional encoder: a type that is also in
      the masked-LM mapping (BERT, RoBERTa, ...) gets a causal-LM class (BertLMHeadModel) that attends causally
      only with is_decoder=True (built without it, transformers warns to add it), so only such a config is a
      causal LM.
    - "seq2seq-lm" for any other type only AutoModelForSeq2SeqLM builds, and "other" for the rest: AutoModel
      builds it, without a head (BERT: BertModel)."""
    import transformers

    auto_map = getattr(config, "auto_map", None) or {}
    remote = set(auto_map) if trust_remote_code else set()

    def builds(auto_class: str, mapping: str) -> bool:
        return type(config) in getattr(transformers, mapping) or auto_class in remote

    seq2seq = builds("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING")
    if seq2seq and getattr(config, "is_encoder_decoder", False):
        return SEQ2SEQ_LM
    encoder = builds("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING") and not getattr(config, "is_decoder", False)
    if builds("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING") and not encoder:
        return CAUSAL_LM
    return SEQ2SEQ_LM if seq2seq else OTHER


def auto_class(kind: str):
    """The transformers auto class a model of `kind` is built with."""
    import transformers

    return getattr(transformers, AUTO_CLASSES[kind])


# ------------------------------------------------------------------------------------------------ count


@dataclass(frozen=True)
class _Counted:
    """What a meta-device build tells: every (name, numel) in model.parameters() order, and the parts that matter."""

    named: list[tuple[str, int]]
    tied: bool
    architecture: str
    embedding: int  # the input embedding table's numel
    decoder_prefix: str | None  # an encoder-decoder's decoder stack, as its parameter names start ("model.decoder")
    linear_modules: tuple[tuple[str, int, int, int], ...]  # ModelProfile.linear_modules
    output_embedding: str  # ModelProfile.output_embedding


def _count_on_meta(config, kind: str, trust_remote_code: bool) -> _Counted:
    """Every (name, numel) of the model built on PyTorch's meta device by its kind's auto class: exact, instant, no
    memory. `named_parameters()` yields a shared (tied) tensor once, so T5's and BART's embedding, shared by the
    encoder, the decoder and the head, counts once."""
    import torch

    builder = auto_class(kind)
    try:
        with torch.device("meta"):
            model = builder.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError:  # its message lists every type the auto class knows: hundreds of names, not repeated here
        name = getattr(config, "model_type", "?")
        raise UserInputError(
            f"transformers {transformers_release()} cannot build model_type '{name}' from its config with "
            f"{builder.__name__}; upgrade transformers, or pass --trust-remote-code if the model ships its own code"
        ) from None
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    tied = False
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is not None and in_emb is not None:
        tied = out_emb.weight is in_emb.weight
    embedding = in_emb.weight.numel() if in_emb is not None else 0
    decoder_prefix = None
    if getattr(config, "is_encoder_decoder", False) and hasattr(model, "get_decoder"):
        decoder = model.get_decoder()
        decoder_prefix = next((n for n, module in model.named_modules() if module is decoder and n), None)
    output = next((n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m is out_emb and n), "")
    return _Counted(named, tied, type(model).__name__, embedding, decoder_prefix, _linear_modules(model), output)


def _linear_modules(model) -> tuple[tuple[str, int, int, int], ...]:
    """(leaf name, in features, out features, count) of every nn.Linear and transformers Conv1D (whose weight is
    stored (in, out): GPT-2's c_attn), grouped by name and shape in the order first met."""
    import torch
    from transformers.pytorch_utils import Conv1D

    counts: dict[tuple[str, int, int], int] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            key = (name.rsplit(".", 1)[-1], module.in_features, module.out_features)
        elif isinstance(module, Conv1D):
            key = (name.rsplit(".", 1)[-1], module.weight.shape[0], module.nf)
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return tuple((*key, count) for key, count in counts.items())


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
        data["linear_modules"] = tuple(tuple(entry) for entry in data.get("linear_modules", ()))
        data["trainable_numels"] = tuple(data.get("trainable_numels", ()))
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
    kind = model_kind(config, trust_remote_code)
    counted = _count_on_meta(config, kind, trust_remote_code)
    named = counted.named
    if not named:
        raise UserInputError(f"model '{name}' has no parameters")
    largest_name, largest = max(named, key=lambda item: item[1])

    # every transformer block by its stack and index: "model.layers.3", or T5's "encoder.block.3" and
    # "decoder.block.3", two blocks
    per_layer: dict[str, int] = {}
    for param_name, numel in named:
        match = _LAYER_RE.search("." + param_name)
        if match:
            block = ("." + param_name)[1 : match.end() - 1]
            per_layer[block] = per_layer.get(block, 0) + numel
    num_layers = _first(text_config, "num_hidden_layers", "n_layer", "num_layers", default=len(per_layer))
    cross_attention_layers = 0
    if counted.decoder_prefix is not None and per_layer:
        # an encoder-decoder: num_hidden_layers is its encoder's depth; its blocks are those of both stacks
        num_layers = len(per_layer)
        cross_attention_layers = sum(1 for block in per_layer if block.startswith(counted.decoder_prefix + "."))
    hidden = _first(text_config, "hidden_size", "n_embd", "d_model")
    heads = _first(text_config, "num_attention_heads", "n_head")
    head_dim = _first(text_config, "head_dim", default=hidden // heads if heads else 0)
    intermediate = _first(
        text_config, "intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim", default=4 * hidden
    )
    has_weights = location.is_dir() and any(any(location.glob(p)) for p in _WEIGHT_PATTERNS)
    return ModelProfile(
        name=name,
        source=source,
        config_dir=str(location),
        architecture=counted.architecture,
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
        tied_embeddings=counted.tied,
        has_weights=has_weights and source == "local",
        input_embedding_numel=counted.embedding,
        kind=kind,
        cross_attention_layers=cross_attention_layers,
        attention_width=heads * head_dim if heads * head_dim != hidden else 0,
        weights_dtype=_dtype_name(getattr(config, "dtype", None)),  # transformers reads a "torch_dtype" key as dtype
        linear_modules=counted.linear_modules,
        output_embedding=counted.output_embedding,
    )


def _dtype_name(dtype) -> str:
    """ "bfloat16" for torch.bfloat16 or "bfloat16" (a config's dtype, as transformers reads it); "" for none."""
    return str(dtype).removeprefix("torch.") if dtype else ""
