"""Resuming a run folder's checkpoints: a change that alters what a checkpoint means is refused with the exact
difference; more steps and moved files with the same contents are stated."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.job import resume

IDENTITY = {
    "model": "/m/a",
    "model_shape": {"architecture": "LlamaForCausalLM", "params": 1000},
    "data_path": "/d/x",
    "data": {"blocks": 2463, "sha256": "aa"},
    "seq_len": 64,
    "micro_batch": 2,
    "grad_accum": 1,
    "world_size": 1,
    "zero_stage": 1,
    "offload_optimizer": "none",
    "offload_param": "none",
    "precision": "bf16",
    "optimizer": {"type": "AdamW", "params": {"lr": 1.3e-5}},
    "schedule": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 4}},
    "seed": 0,
    "steps": 6,
}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"seq_len": 128}, "--seq-len is 128 (the checkpoint's run used 64)"),
        ({"micro_batch": 4}, "--micro-batch is 4 (the checkpoint's run used 2)"),
        ({"grad_accum": 2}, "--grad-accum is 2 (the checkpoint's run used 1)"),
        ({"world_size": 2}, "the number of ranks (--num-gpus, --hostfile) is 2 (the checkpoint's run used 1)"),
        ({"zero_stage": 3}, "--zero-stage is 3 (the checkpoint's run used 1)"),
        ({"offload_optimizer": "cpu"}, "--offload-optimizer is cpu (the checkpoint's run used none)"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 6.25e-3}}}, "the optimizer (--lr, "),
        ({"data": {"blocks": 87, "sha256": "bb"}}, "(--data) changed (blocks 2463 -> 87, sha256 aa -> bb)"),
        ({"model_shape": {"architecture": "LlamaForCausalLM", "params": 9}}, "(--model) changed (params 1000 -> 9)"),
        ({"seed": 1}, "--seed (the data order) is 1"),
        ({"steps": 3}, "--steps 3 is behind the checkpoint at step 6: pass --steps 6 or more"),
        ({"checkpoints": "/local/offload-launch-ab"}, "(--node-local-checkpoints) is /local/offload-launch-ab (the "
         "checkpoint's run used OUT/checkpoints)"),  # IDENTITY predates the key: it was shared
    ],
)  # fmt: skip
def test_a_change_that_alters_what_the_checkpoint_means_is_refused_with_the_exact_difference(change, says):
    check = resume.resume_changes(IDENTITY, {**IDENTITY, **change}, 6)
    assert [says in problem for problem in check.problems] == [True], check.problems
    line = resume.refusal(Path("runs/x"), check)
    assert "\n" not in line and "--no-resume to start over" in line and "rerun the same command" not in line


def test_more_steps_and_moved_files_with_the_same_contents_are_stated_not_refused():
    moved = {**IDENTITY, "steps": 10, "data_path": "/elsewhere/x", "model": "/elsewhere/m"}
    check = resume.resume_changes(IDENTITY, moved, 6)
    assert check.problems == () and len(check.notes) == 3
    assert "resuming after step 6; the learning-rate decay now ends at step 10" in check.notes[0]
    unknown_data = {**IDENTITY, "data": None, "data_path": "/elsewhere/x"}  # a dry run: not tokenized
    assert resume.resume_changes(IDENTITY, unknown_data, 6) == resume.ResumeCheck(6)


def test_nothing_to_resume_means_nothing_to_compare():
    assert resume.resume_changes(IDENTITY, {**IDENTITY, "seq_len": 9}, 0) == resume.ResumeCheck(0)
