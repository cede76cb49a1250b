"""Whether a run may resume from its output folder's checkpoints (rundir.py finds them and keeps the identity of the
run that wrote them).

Before anything starts, the identity of the run about to start is compared with the one the checkpoints were
trained with (`resume_changes`): more --steps is stated and allowed, anything that changes what a checkpoint means
is refused with the exact difference and the way forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.job.rundir import SHARED_CHECKPOINTS

# What a resumed run must share with the run that wrote the checkpoint, and where the user sets it.
IDENTITY_FLAGS = {
    "model_shape": "the model's architecture (--model)",
    "data": "the data's contents (--data)",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "grad_accum": "--grad-accum",
    "world_size": "the number of ranks (--num-gpus, --hostfile)",
    "zero_stage": "--zero-stage",
    "offload_optimizer": "--offload-optimizer",
    "offload_param": "--offload-param",
    "precision": "--precision",
    "optimizer": "the optimizer (--lr, --weight-decay, --ds-config)",
    "schedule": "the learning-rate schedule (--warmup-steps, --ds-config)",
    "seed": "--seed (the data order)",
    "lora": "the adapter (--lora, --lora-rank, --lora-alpha, --lora-dropout, --lora-target)",
    "checkpoints": "where the checkpoints are (--node-local-checkpoints)",
}
# keys whose None is a value (no adapter), not "not known yet"
KNOWN_WHEN_NONE = frozenset({"lora"})
# what a run recorded before its identity had the key
IDENTITY_DEFAULTS = {"checkpoints": SHARED_CHECKPOINTS, "lora": None}


@dataclass(frozen=True)
class ResumeCheck:
    step: int  # the newest complete checkpoint's step (0: nothing to resume)
    notes: tuple[str, ...] = ()  # safe changes, each stated in one line
    problems: tuple[str, ...] = ()  # changes that make the checkpoint mean something else


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out: dict = {}
        for key, item in value.items():
            out |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def _difference(key: str, before, now) -> str:
    """'--seq-len is 128 (the checkpoint's run used 64)', or for a nested setting each leaf that differs."""
    what = IDENTITY_FLAGS[key]
    if isinstance(before, dict) or isinstance(now, dict):
        old, new = _flat(before or {}), _flat(now or {})
        leaves = [
            f"{leaf} {old.get(leaf)} -> {new.get(leaf)}"
            for leaf in sorted({*old, *new})
            if old.get(leaf) != new.get(leaf)
        ]
        return f"{what} changed ({', '.join(leaves)})"
    return f"{what} is {now} (the checkpoint's run used {before})"


def resume_changes(previous: dict | None, current: dict, step: int, *, legacy: bool = False) -> ResumeCheck:
    """Compare the run about to start (`current`, run_identity in job/prepare.py) with the one whose newest
    complete checkpoint is at `step`. A field the caller could not know yet (None: the data's fingerprint in a
    --dry-run) is not compared."""
    if step == 0:
        return ResumeCheck(0)
    if previous is None:
        why = (
            "an earlier offload-launch wrote it without recording its settings"
            if legacy
            else "its settings are not recorded"
        )
        return ResumeCheck(step, problems=(f"cannot tell whether it fits this run: {why}",))
    previous = {**IDENTITY_DEFAULTS, **previous}
    changed = [
        key
        for key in IDENTITY_FLAGS
        if (current.get(key) is not None or key in KNOWN_WHEN_NONE) and previous.get(key) != current.get(key)
    ]
    problems = [_difference(key, previous.get(key), current.get(key)) for key in changed]
    notes = []
    steps = current["steps"]  # None: --epochs before the data is read (checked again with the data)
    if steps is not None and steps < step:
        problems.append(f"--steps {steps} is behind the checkpoint at step {step}: pass --steps {step} or more")
    elif steps is not None and steps != previous.get("steps"):
        notes.append(
            f"--steps is {steps} (the run was planned for {previous.get('steps')}): resuming after step {step}; the "
            f"learning-rate decay now ends at step {steps}"
        )
    # a model or data set that moved is the same run when its contents are the same
    for path_key, content_key, flag in (("model", "model_shape", "--model"), ("data_path", "data", "--data")):
        if (
            previous.get(path_key) != current.get(path_key)
            and current.get(content_key) is not None
            and content_key not in changed
        ):
            notes.append(
                f"{flag} is now {current.get(path_key)} (was {previous.get(path_key)}), with the same contents"
            )
    return ResumeCheck(step, tuple(notes), tuple(problems))


def refusal(out: Path, check: ResumeCheck) -> str:
    """The one line that refuses a resume: every difference, then the ways forward."""
    return (
        f"cannot resume {out} from its checkpoint at step {check.step}: {'; '.join(check.problems)}; rerun with the "
        f"checkpoint's settings, pass --no-resume to start over (it deletes the checkpoints, metrics and export in "
        f"{out}), or pass another --output-dir"
    )
