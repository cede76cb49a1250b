"""Export: the trained model as OUT/final, loadable with AutoModelForCausalLM.from_pretrained(OUT/final)
(AutoModelForSeq2SeqLM for an encoder-decoder: run.json's model_class says which)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FINAL_DIR = "final"
MERGED_DIR = "final-merged"  # a LoRA's --merge: the base with the adapter merged in (rank/adapter.export_merged)


def drop_optimizer_state(engine) -> None:
    """Free Adam's moments before the export gathers the model (plan/peaks.py [DS-export]): the last step's checkpoint
    holds them, and nothing steps again, so the export's copy of the weights takes their room instead of adding to
    the run's peak. DeepSpeed's ZeRO optimizers wrap the one that keeps them (`.optimizer`, a torch Optimizer whose
    `state` maps each parameter to its exp_avg and exp_avg_sq)."""
    optimizer = getattr(engine.optimizer, "optimizer", engine.optimizer)
    state = getattr(optimizer, "state", None)
    if state is not None:
        state.clear()


def export_final(engine, tokenizer, out: Path, rank: int, zero3: bool) -> Path:
    """OUT/final: weights consolidated from the ZeRO shards, saved with save_pretrained, plus the
    tokenizer. Collective: every rank calls it; rank 0 writes OUT/final.tmp, then replaces OUT/final with it."""
    import torch.distributed as dist

    if zero3:
        state_dict = engine._zero3_consolidated_16bit_state_dict()  # collective: every rank calls
    else:
        state_dict = engine.module.state_dict() if rank == 0 else None
    final, tmp = out / FINAL_DIR, out / f"{FINAL_DIR}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        engine.module.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final
