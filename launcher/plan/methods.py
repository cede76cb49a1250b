"""Advice across training methods: what the other method would cost on the same host. Full fine-tuning and a LoRA
learn different things (a LoRA's update is rank r: adapters.py [LoRA]), so the plan never switches between them;
it says what the other one would need, and the choice stays the user's (--lora, or dropping it)."""

from __future__ import annotations

import dataclasses

from launcher import settings
from launcher.plan.workload import Workload

# the strategy pins a workload may carry: the other method is planned without them (its own best strategy)
STRATEGY_PINS = ("zero_stage", "offload_optimizer", "offload_param", "offload_ratio")
LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "merge")


def worth_advising(workload: Workload, offloads: bool, fits: bool) -> bool:
    """Full fine-tuning is compared with a LoRA when it fits only with offload or not at all; a LoRA always with
    full fine-tuning (what the adapter saves)."""
    return workload.lora or offloads or not fits


def other_method(workload: Workload) -> Workload:
    """The workload with the other method: a LoRA at the defaults (r = 8, auto targets), or full fine-tuning; the
    sequence, batch, ranks and precision as asked, the strategy left to the planner."""
    defaults = settings.defaults()
    unpinned = {name: defaults[name] for name in STRATEGY_PINS + LORA_SETTINGS}
    return dataclasses.replace(workload, lora=not workload.lora, **unpinned)


def summary(plan) -> dict:
    """The other method's plan in a few figures: its method, the strategy it would take, memory per tier and step
    time (or that it does not fit, and the nearest candidate's first problem)."""
    chosen = plan.chosen
    figures = {
        "method": "lora" if plan.lora else "full",
        "lora": plan.lora.to_json() if plan.lora else None,
        "trainable_params": plan.model.optimized_params,
        "fits": chosen is not None,
    }
    if chosen is None:
        nearest = next((c for c in plan.candidates if c.problems), None)
        return figures | {"problem": nearest.problems[0] if nearest else "no candidate"}
    return figures | {
        "strategy": chosen.strategy.label,
        "gpu_bytes_per_device": chosen.memory.gpu_bytes_per_device,
        "cpu_bytes": chosen.memory.cpu_bytes,
        "nvme_bytes": chosen.memory.nvme_bytes,
        "step_seconds": chosen.timing.step_seconds,
        "tokens_per_s": chosen.timing.tokens_per_s,
    }
