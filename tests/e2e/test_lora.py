"""LoRA trained for real on the CPU accelerator (issue 27): ZeRO-2 and ZeRO-3, with and without the optimizer and the
parameters offloaded, one and two ranks. The loss falls, the frozen base keeps its bytes, the checkpoints hold the
adapter alone, a resume lands on the uninterrupted run's curve (dropout included) and refuses another adapter, and
OUT/final is a peft adapter whose model computes what the trained one did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import DEMO_TEXT, NODE_PEAK_BAND, launch, read_metrics, run_launch

pytestmark = pytest.mark.e2e

STEPS = 6
LORA = ("--lora", "--lora-target", "all-linear", "--lr", "2e-2", "--warmup-steps", "2")
MAIN = (*LORA, "--lora-dropout", "0.1", "--num-gpus", "2")  # ZeRO-3 and both offloads: `partitioned`'s ds_config
LOSS_TOLERANCE = 1e-4  # same seed, same data, same restored state: float32 rounding only (tests/e2e/test_faults.py)


@pytest.fixture(scope="module")
def base_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny Llama with weights (a LoRA adapts a trained base; random weights saved in bf16, seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("lora-base") / "model"
    shutil.copytree(tiny_model, folder)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lora-eval") / "eval.jsonl"
    path.write_text("\n".join(DEMO_TEXT.read_text().splitlines()[-20:]) + "\n")
    return path


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory) -> Path:
    """A --ds-config that makes ZeRO-3 partition every adapter tensor (the plan keeps them whole: capacity.py), as a
    large rank does on a large model: the export must gather them (rank/adapter.py [peft-save])."""
    path = tmp_path_factory.mktemp("lora-config") / "ds_config.json"
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    zero |= {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}  # pinned here, not by flags
    path.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": zero}))
    return path


@pytest.fixture(scope="module")
def main_run(base_model, tiny_data, eval_data, partitioned, tmp_path_factory) -> Path:
    """ZeRO-3 on two ranks with the optimizer and the parameters on the CPU, the adapter partitioned, dropout 0.1,
    an eval loss at the end, and --merge."""
    out = tmp_path_factory.mktemp("lora-main") / "run"
    options = (*MAIN, "--steps", str(STEPS), "--save-every", "3", "--eval-data", str(eval_data))
    run_launch(base_model, tiny_data, out, *options, "--ds-config", str(partitioned), "--merge")
    return out


def check_lora_run(out: Path, *, stage: int, world: int, offload_optimizer: str, offload_param: str) -> dict:
    run = json.loads((out / "run.json").read_text())
    assert (run["zero_stage"], run["world_size"]) == (stage, world)
    assert (run["offload_optimizer"], run["offload_param"]) == (offload_optimizer, offload_param)
    assert run["final_loss"] < run["first_loss"], (run["first_loss"], run["final_loss"])
    assert run["adapter"]["rank"] == 8 and "down_proj" in run["adapter"]["targets"]
    assert run["frozen_base_unchanged"] is True  # every rank's frozen bytes, hashed at load and after the last step
    low, high = NODE_PEAK_BAND  # the plan's host RAM at its peak moment against the node's measured peak
    assert low <= run["ratios"]["cpu_bytes_per_node"] <= high, (run["measured"], run["predicted"])
    final = out / "final"
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()  # an adapter, not a copy of the base
    return run


def adapter_tensors(final: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(final / "adapter_model.safetensors"))


def test_zero3_two_ranks_offloaded_trains_only_the_adapter(main_run, base_model):
    check_lora_run(main_run, stage=3, world=2, offload_optimizer="cpu", offload_param="cpu")
    assert (
        json.loads((main_run / "ds_config.json").read_text())["zero_optimization"]["stage3_param_persistence_threshold"]
        == 0
    )  # every adapter tensor partitioned
    tensors = adapter_tensors(main_run / "final")
    # 2 layers x 7 linear layers x (lora_A, lora_B), none empty (ZeRO-3 partitions them: the export gathers first)
    assert len(tensors) == 28 and all(t.numel() > 0 for t in tensors.values())
    assert all(t.abs().sum() > 0 for name, t in tensors.items() if "lora_B" in name)  # B starts at zero: it trained
    import torch

    for checkpoint in (main_run / "checkpoints").glob("step*/zero_pp_rank_*_model_states.pt"):
        module = torch.load(checkpoint, map_location="cpu", weights_only=False)["module"]
        assert module and all("lora_" in key for key in module), sorted(module)[:3]  # no frozen base in it


def test_the_exported_adapter_computes_what_the_trained_model_did(main_run, base_model):
    """PeftModel.from_pretrained(base, OUT/final) on the held-out rows: the eval loss the trained engine reported at
    its last step, to bf16 rounding, and well away from the base's own."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.data.blocks import load_splits
    from launcher.data.rows import count_tokens
    from launcher.job.spec import RunSpec

    spec = RunSpec.load(main_run / "run_spec.json")
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    _, held = load_splits(spec.data, spec.rows_layout(), tokenizer, main_run / "cache", eval_data=spec.eval_data)

    def eval_loss(model) -> float:
        total = tokens = 0.0
        with torch.no_grad():
            for start in range(0, len(held), 4):
                rows = list(range(start, min(len(held), start + 4)))
                inputs = {name: torch.from_numpy(array) for name, array in held.inputs(rows).items()}
                trained = count_tokens(inputs, False)["trained"]
                total += model(**inputs).loss.double().item() * trained
                tokens += trained
        return total / tokens

    def base():
        return AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.bfloat16).eval()

    reported = json.loads((main_run / "run.json").read_text())["eval_loss"]
    adapted = eval_loss(PeftModel.from_pretrained(base(), main_run / "final").eval())
    untouched = eval_loss(base())
    assert abs(adapted - reported) < 0.05 * abs(untouched - reported), (adapted, reported, untouched)
    # --merge: a whole model, loaded without peft, that computes the same
    merged = eval_loss(AutoModelForCausalLM.from_pretrained(main_run / "final-merged", dtype=torch.bfloat16).eval())
    assert abs(merged - reported) < 0.05 * abs(untouched - reported), (merged, reported, untouched)
    assert not list((main_run / "final-merged").glob("adapter_*"))


@pytest.mark.parametrize(
    ("stage", "world", "offload"),
    [("2", 1, "none"), ("2", 2, "cpu"), ("3", 1, "none")],
    ids=["zero2-1rank", "zero2-2ranks-opt-cpu", "zero3-1rank"],
)
def test_lora_trains_at_every_stage(base_model, tiny_data, tmp_path, stage, world, offload):
    out = tmp_path / "run"
    options = (*LORA, "--num-gpus", str(world), "--zero-stage", stage, "--offload-optimizer", offload)
    run_launch(base_model, tiny_data, out, *options, "--steps", "4")
    check_lora_run(out, stage=int(stage), world=world, offload_optimizer=offload, offload_param="none")
    assert all(t.numel() > 0 for t in adapter_tensors(out / "final").values())


def test_resume_lands_on_the_uninterrupted_curve_and_refuses_another_adapter(
    main_run, base_model, tiny_data, eval_data, partitioned, tmp_path
):
    out = tmp_path / "run"
    options = (*MAIN, "--steps", str(STEPS), "--save-every", "3", "--eval-data", str(eval_data))
    options += ("--ds-config", str(partitioned))
    # SIGKILL in step 5, after its first backward (launcher/drills.py): the checkpoint of step 3 is the newest
    killed = launch(base_model, tiny_data, out, *options, env={"OFFLOAD_LAUNCH_KILL_AT": "step:5"})
    assert killed.returncode != 0 and not (out / "run.json").exists()
    resumed = run_launch(base_model, tiny_data, out, *options)
    assert "resumed from step3 (step 3)" in resumed.stderr
    reference = [m["loss"] for m in read_metrics(main_run)]
    losses = [m["loss"] for m in read_metrics(out)]
    assert len(losses) == STEPS and max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < LOSS_TOLERANCE

    refused = launch(base_model, tiny_data, out, *options, "--lora-rank", "16")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "the adapter (--lora, --lora-rank" in refused.stderr and "rank 8 -> 16" in refused.stderr
