"""A LoRA adapter on one rank: attached with peft before DeepSpeed builds the engine, its checkpoint keys checked on
resume, and exported as a peft adapter folder (OUT/final: adapter_config.json + adapter_model.safetensors) that
`PeftModel.from_pretrained(base, OUT/final)` loads.

Sources (peft 0.22, DeepSpeed 0.19.8 as installed):
  [peft-save] peft PeftModel.save_pretrained(..., state_dict=...) -> get_peft_model_state_dict: the adapter's keys of
            the state_dict it is given (`model.state_dict()` when none). Under ZeRO-3 a partitioned parameter's
            state_dict entry is an empty placeholder, so a plain save_pretrained writes empty tensors (peft issue
            2892: "adapter_model.safetensors file of just 40 bytes"); the export gathers the adapter first
            (deepspeed.zero.GatheredParameters) and hands peft the gathered values.
  [DS-strict] engine.py load_checkpoint(load_module_strict=...) -> module.load_state_dict(strict=...): a checkpoint
            saved with exclude_frozen_parameters lacks every frozen key, which strict loading refuses, and
            strict=False would also accept one that lacks adapter keys - so those are checked here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from launcher.inspection.model import SEQ2SEQ_LM

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's SAFETENSORS_WEIGHTS_NAME
ADAPTER_CONFIG = "adapter_config.json"  # peft's CONFIG_NAME


def attach(model, lora: dict, model_kind: str, dtype):
    """`model` with a LoRA on `lora["targets"]` (peft get_peft_model, which freezes everything else), the adapter
    in the training dtype `dtype` like the base (peft would keep it in fp32: autocast_adapter_dtype), so every
    ZeRO stage trains the same numbers."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["targets"]),
        bias="none",
        task_type=TaskType.SEQ_2_SEQ_LM if model_kind == SEQ2SEQ_LM else TaskType.CAUSAL_LM,
    )
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    for param in peft_model.parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
    return peft_model


def frozen_digest(module) -> str:
    """SHA-256 of this rank's bytes of every frozen parameter, by name: the whole tensor, or under ZeRO-3 the rank's
    partition (`ds_tensor`), wherever it lives (GPU, CPU; a partition swapped out to NVMe is not read). It reads the
    base once at load and once after the last step: seconds per 10 GB (SHA-256 at ~1-2 GB/s)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        if param.requires_grad:
            continue
        local = getattr(param, "ds_tensor", param.data)
        digest.update(name.encode())
        digest.update(local.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def trainable_names(module) -> set[str]:
    return {name for name, param in module.named_parameters() if param.requires_grad}


def check_checkpoint_keys(engine, folder: Path, tag: str) -> None:
    """[DS-strict] the module state of an adapter's checkpoint holds every adapter parameter: a checkpoint of another
    adapter (other targets) or of nothing fails here, before a step trains on stale weights. The file is the one
    this rank's load read (ZeRO-3: each rank's own)."""
    import torch

    tag_folder = folder / tag
    path = engine._get_ckpt_name(str(folder), tag)
    saved = set(torch.load(path, map_location="cpu", weights_only=False)["module"])
    missing = sorted(trainable_names(engine.module) - saved)
    if missing:
        raise SystemExit(
            f"[offload-launch] checkpoint {tag_folder} lacks {len(missing)} adapter parameter(s) of this run "
            f"(first: {missing[0]}): it was written by another adapter or by full fine-tuning; pass --no-resume"
        )


def export_adapter(engine, tokenizer, out: Path, rank: int, zero3: bool, final_dir: str) -> Path:
    """OUT/final as a peft adapter folder, the adapter gathered first under ZeRO-3 [peft-save], plus the tokenizer;
    `validate_adapter` then refuses an empty or partitioned one. Collective: every rank calls it; rank 0 writes
    OUT/final.tmp, then replaces OUT/final with it."""
    import deepspeed
    import torch.distributed as dist

    module = engine.module
    named = [(name, param) for name, param in module.named_parameters() if param.requires_grad]
    gather = deepspeed.zero.GatheredParameters([p for _, p in named]) if zero3 else contextlib.nullcontext()
    final, tmp = out / final_dir, out / f"{final_dir}.tmp"
    with gather:
        if rank == 0:
            state_dict = {name: param.detach().cpu().clone() for name, param in named}
            shutil.rmtree(tmp, ignore_errors=True)
            module.save_pretrained(tmp, state_dict=state_dict)
    if rank == 0:
        validate_adapter(tmp, {name: tuple(tensor.shape) for name, tensor in state_dict.items()})
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def export_merged(spec, tokenizer, adapter_dir: Path, rank: int, merged_dir: str) -> Path:
    """OUT/final-merged (--merge): on rank 0, the base loaded again in CPU RAM in the adapter's dtype,
    PeftModel.from_pretrained with the exported adapter, merged (W + alpha/r·B·A, peft `merge_and_unload`) and saved
    with save_pretrained, plus the tokenizer. peft's DeepSpeed guide calls merging inside a ZeRO-3 engine
    unsupported; the base on the CPU is exact, at w·P of rank 0's host RAM plus the largest tensor (plan/peaks.py
    [merge]). Collective: the other ranks wait for it."""
    import torch.distributed as dist
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    # The run's HfDeepSpeedConfig would make from_pretrained partition the base under zero.Init, a collective that
    # rank 0 alone would wait in forever; training is over, so it goes
    unset_hf_deepspeed_config()
    final, tmp = spec.out / merged_dir, spec.out / f"{merged_dir}.tmp"
    if rank == 0:
        from peft import PeftModel
        from safetensors import safe_open

        from launcher.inspection.model import auto_class

        with safe_open(str(adapter_dir / ADAPTER_WEIGHTS), framework="pt") as handle:
            dtype = handle.get_tensor(next(iter(handle.keys()))).dtype
        base = auto_class(spec.model_kind).from_pretrained(
            spec.model, dtype=dtype, trust_remote_code=spec.trust_remote_code
        )
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def validate_adapter(folder: Path, expected: dict[str, tuple[int, ...]]) -> None:
    """The adapter file holds one non-empty tensor per adapter parameter, each of its trained shape; SystemExit
    names the first that is not (peft writes keys without the adapter's name: "...lora_A.weight")."""
    from safetensors import safe_open

    if not (folder / ADAPTER_CONFIG).is_file():
        raise SystemExit(f"[offload-launch] the exported adapter has no {ADAPTER_CONFIG}: peft cannot load it")
    with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt") as handle:
        written = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    shapes = {_peft_key(name): shape for name, shape in expected.items()}
    for key, shape in shapes.items():
        got = written.get(key)
        if got != shape or 0 in shape:
            raise SystemExit(
                f"[offload-launch] the exported adapter is wrong: {key} is {got}, trained {shape} "
                "(an ungathered ZeRO-3 partition is empty)"
            )
    if set(written) != set(shapes):
        raise SystemExit(f"[offload-launch] the exported adapter has other keys: {sorted(set(written) - set(shapes))}")


def _peft_key(name: str) -> str:
    """A trained parameter's name as peft saves it: without the adapter's name (".default")."""
    return name.replace(".default.", ".")
