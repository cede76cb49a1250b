"""LoRA adapters as the planner sees them: which linear layers get one, how many parameters they add, and the model
profile the memory and time models then size (`adapted`): every parameter still weighs on the tiers, only the
adapter's are the optimizer's.

Sources:
  [LoRA]    Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1: W0 + B·A with
            B in R^{d x r}, A in R^{r x k}, W0 frozen; peft builds them as lora_A = nn.Linear(in, r, bias=False) and
            lora_B = nn.Linear(r, out, bias=False) (peft tuners/lora/layer.py `update_layer`), so a targeted
            Linear(in, out) adds r·(in + out) parameters in two tensors, r·in and out·r. Llama-2-7B's q_proj and
            v_proj at r = 8: 32 x 2 x 8 x (4096 + 4096) = 4,194,304, peft's "trainable params: 4,194,304".
  [LoRA-act] peft tuners/lora/layer.py Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling. Autograd keeps
            lora_A's output for lora_B's weight gradient (2·r B per token in 16-bit) and, with dropout, the dropped-out
            input for lora_A's weight gradient (2·in B) and its mask (1·in B, torch's bool mask); without dropout
            lora_A's input is x itself, which [Korth]'s count (memory.py) holds already. These add to the base's
            activations, per adapted layer and token.
  [peft-targets] peft utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: the layers peft
            targets by default per model_type (a copy of the families bundled here; tests/plan/test_adapters.py
            checks it against the installed peft); "all-linear" (tuners_utils.py
            `_maybe_include_all_linear_layers`): every Linear and Conv1D but the output embedding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.errors import UserInputError
from launcher.inspection.model import ModelProfile
from launcher.plan.strategy import BYTES_16BIT

ALL_LINEAR = "all-linear"
AUTO = "auto"
# [peft-targets] the default targets of the model families offload-launch bundles or names in its docs
PEFT_DEFAULT_TARGETS = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "opt": ("q_proj", "v_proj"),
    "bart": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",),
    "t5": ("q", "v"),
    "mt5": ("q", "v"),
    "bert": ("query", "value"),
    "falcon": ("query_key_value",),
    "gpt_neox": ("query_key_value",),
    "bloom": ("query_key_value",),
}


@dataclass(frozen=True)
class Lora:
    """One LoRA as the run trains it: rank r, scaling alpha / r, dropout on the adapter's input, and the leaf names
    of the linear layers it adapts (resolved for one model: `resolve`)."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]

    def to_json(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}


def linear_names(model: ModelProfile) -> list[str]:
    """The model's linear layers' leaf names, each once, in the order first met."""
    return list(dict.fromkeys(name for name, *_ in model.linear_modules))


def resolve_targets(model: ModelProfile, asked: str) -> tuple[str, ...]:
    """The leaf names `--lora-target` means for this model: "auto" is peft's default for its family where every
    name exists in the model, else "all-linear"; "all-linear" every linear layer but the output embedding; else a
    comma-separated list, each a linear layer of the model (a UserInputError lists them)."""
    names = linear_names(model)
    if not names:
        raise UserInputError(f"{model.name} has no linear layers for a LoRA to adapt")
    if asked == AUTO:
        family = PEFT_DEFAULT_TARGETS.get(model.model_type, ())
        if family and all(name in names for name in family):
            return family
        asked = ALL_LINEAR
    if asked == ALL_LINEAR:
        return tuple(name for name in names if name != model.output_embedding)
    wanted = tuple(dict.fromkeys(part.strip() for part in asked.split(",") if part.strip()))
    unknown = [name for name in wanted if name not in names]
    if unknown or not wanted:
        named = ", ".join(unknown) if unknown else repr(asked)
        raise UserInputError(
            f"--lora-target: {named} is not a linear layer of {model.name}; "
            f"it has {', '.join(names)} (or use auto, {ALL_LINEAR})"
        )
    return wanted


def adapter_numels(model: ModelProfile, lora: Lora) -> tuple[int, ...]:
    """[LoRA] every adapter tensor's numel, lora_A (r·in) then lora_B (out·r) per targeted layer."""
    numels: list[int] = []
    for name, fan_in, fan_out, count in model.linear_modules:
        if name in lora.targets:
            numels += [lora.rank * fan_in, fan_out * lora.rank] * count
    return tuple(numels)


def saved_bytes_per_token(model: ModelProfile, lora: Lora) -> int:
    """[LoRA-act] the bytes autograd keeps per token for the adapters' backward, over every adapted layer."""
    dropout = lora.dropout > 0
    return sum(
        count * (BYTES_16BIT * lora.rank + (3 * fan_in if dropout else 0))
        for name, fan_in, _, count in model.linear_modules
        if name in lora.targets
    )


def adapted(model: ModelProfile, lora: Lora | None) -> ModelProfile:
    """The profile the plan sizes for a LoRA run: the adapter's tensors added to the model's (they are parameters of
    the trained module, in 16-bit like the base), and only they trainable. `model` itself without a LoRA."""
    if lora is None:
        return model
    numels = adapter_numels(model, lora)
    return dataclasses.replace(
        model,
        params=model.params + sum(numels),
        param_numels=model.param_numels + numels,
        trainable_params=sum(numels),
        trainable_numels=numels,
        adapter_saved_bytes_per_token=saved_bytes_per_token(model, lora),
    )
