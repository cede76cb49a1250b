"""Loading the model a rank trains: from --model's weights (or initialised from its config), in the run's 16-bit
dtype, partitioned as it loads under ZeRO-3, with activation recomputation and, for a LoRA, the adapter attached
(adapter.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from launcher.inspection.model import auto_class
from launcher.job.spec import RunSpec
from launcher.measure.passes import enable_recompute
from launcher.rank import adapter


def load_model(spec: RunSpec, ds_config: dict, log: Callable[[str], None]):
    """(the model, the HfDeepSpeedConfig the caller must keep referenced while it loads or None). The model class is
    the one the export names (AutoModelForCausalLM, or AutoModelForSeq2SeqLM for T5 and BART)."""
    from transformers import AutoConfig

    auto = auto_class(spec.model_kind)
    dtype = training_dtype(ds_config)
    hf_ds_config = None
    if ds_config.get("zero_optimization", {}).get("stage") == 3:
        # A live HfDeepSpeedConfig makes from_pretrained/from_config run under deepspeed.zero.Init, so
        # weights are partitioned as they load and no rank holds a full copy (DeepSpeed issues 1814, 5617).
        from transformers.integrations import HfDeepSpeedConfig

        hf_ds_config = HfDeepSpeedConfig(ds_config)
    kwargs = {"trust_remote_code": spec.trust_remote_code}
    if has_weights(spec.model):
        model = auto.from_pretrained(spec.model, dtype=dtype, **kwargs)
    else:
        log(f"warning: no weights in {spec.model}: starting from random initialization")
        config = AutoConfig.from_pretrained(spec.model, **kwargs)
        model = auto.from_config(config, dtype=dtype, **kwargs)
    if spec.activation_checkpointing:
        enable_recompute(model)  # non-reentrant: a LoRA gets its gradients behind a frozen embedding too
    model.config.use_cache = False
    if spec.lora:
        model = adapter.attach(model, spec.lora, spec.model_kind, dtype)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"LoRA r={spec.lora['rank']} on {', '.join(spec.lora['targets'])}: {trainable:,} trainable parameters")
    return model, hf_ds_config


def training_dtype(ds_config: dict):
    """The dtype DeepSpeed trains the module in: bf16 or fp16 where the config enables one (DeepSpeed reads
    "bfloat16" as the old name of "bf16": runtime/config.py get_bfloat16_config), else fp32, DeepSpeed's default
    (a --ds-config that enables neither)."""
    import torch

    bf16 = ds_config.get("bf16", ds_config.get("bfloat16", {}))
    if bf16.get("enabled") is True:
        return torch.bfloat16
    return torch.float16 if ds_config.get("fp16", {}).get("enabled") is True else torch.float32


def has_weights(model: str) -> bool:
    """Whether `model` comes with weights: a hub id (from_pretrained fetches them) or a folder holding some."""
    path = Path(model)
    if not path.is_dir():
        return True  # a hub id: from_pretrained fetches its weights
    return any(any(path.glob(pattern)) for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth"))
