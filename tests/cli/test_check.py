"""`offload-launch check FILE` and `--ds-config FILE` through the real CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner

from launcher.cli import cli
from tests.helpers import host_path

BROKEN = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "zero_optimisation": {"stage": 3},  # DeepSpeed ignores it: a warning
    # DeepSpeedZeroConfig refuses both: errors (its 5e8 would be the integer 500000000, a note)
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 15099494.4, "offload_optimiser": {"device": "cpu"}},
    "aio": {"thread_count": 4},  # DeepSpeed ignores the old name: a warning
}
HF_STYLE = {  # what people copy from the Hugging Face docs
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
}


def write(tmp_path, config, name="ds.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_check_reports_each_problem_with_its_path_and_exits_2(tmp_path):
    path = write(tmp_path, BROKEN)
    result = CliRunner().invoke(cli, ["check", path, "--model", "meta-llama/Llama-2-7b", "--host-spec", "1x-a100-80g"])
    assert result.exit_code == 2, result.output
    assert "warning: zero_optimisation: does nothing: DeepSpeed ignores" in result.output
    assert "did you mean 'zero_optimization'?" in result.output
    assert "error: zero_optimization.reduce_bucket_size: 15099494.4 is not a whole number" in result.output
    assert "error: zero_optimization.offload_optimiser: unknown key" in result.output
    assert "warning: aio.thread_count: old name of intra_op_parallelism" in result.output
    # the third error: stage 2 without offload does not fit the 80 GB GPU
    assert "3 error(s), 2 warning(s)" in result.output and "Traceback" not in result.output


def test_check_json_and_a_clean_generated_config(tmp_path):
    out = tmp_path / "generated.json"
    args = ["--model", "meta-llama/Llama-2-7b", "--host-spec", host_path("1x-a100-80g")]
    assert CliRunner().invoke(cli, [*args, "--dry-run", "--config-out", str(out)]).exit_code == 0
    result = CliRunner().invoke(cli, ["check", str(out), *args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["errors"] == 0 and report["world_size"] == 1


def test_check_offload_that_does_not_fit_this_host(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}  # no offload: 70B on 80 GB
    path = write(tmp_path, config)
    result = CliRunner().invoke(
        cli, ["check", path, "--model", "meta-llama/Llama-2-70b-hf", "--host-spec", "1x-a100-80g"]
    )
    assert result.exit_code == 2
    assert "does not fit this host" in result.output and "GPU needs" in result.output


def test_ds_config_fills_auto_from_the_plan_and_pins_its_choices(tmp_path):
    path = write(tmp_path, HF_STYLE)
    args = ["--model", "meta-llama/Llama-2-7b", "--host-spec", "1x-a100-80g", "--ds-config", path]
    result = CliRunner().invoke(cli, [*args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{") :])
    config = plan["ds_config"]
    assert plan["strategy"]["label"] == "ZeRO-3 + opt->cpu"  # the user's stage and offload, not the plan's pick
    assert config["gradient_accumulation_steps"] == 4 and plan["workload"]["grad_accum"] == 4  # user value wins
    assert config["train_micro_batch_size_per_gpu"] == 1 and config["train_batch_size"] == 4  # auto filled
    assert isinstance(config["zero_optimization"]["reduce_bucket_size"], int)
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["optimizer"]["type"] == "AdamW"  # absent in the user's file: the plan's (DeepSpeedCPUAdam)


def test_ds_config_with_errors_is_refused_in_one_line(tmp_path):
    path = write(tmp_path, BROKEN)
    result = CliRunner().invoke(
        cli, ["--model", "launcher/demo/tiny-llama", "--host-spec", "1x-a100-80g", "--ds-config", path, "--dry-run"]
    )
    assert result.exit_code == 2
    assert "Error: --ds-config: zero_optimization.offload_optimiser: unknown key" in result.output
    assert "(and 1 more: run offload-launch check on it)" in result.output


def test_ds_config_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {\n  "stage": 3,,\n}}')
    for path, message in ((str(bad), "bad.json:2: invalid JSON"), (str(tmp_path / "no.json"), "No such file")):
        result = CliRunner().invoke(cli, ["check", path, "--model", "meta-llama/Llama-2-7b"])
        assert result.exit_code == 2 and message in result.output, result.output


def test_a_typed_option_that_contradicts_the_user_config_is_refused(tmp_path):
    path = write(tmp_path, HF_STYLE)
    args = ["--model", "meta-llama/Llama-2-7b", "--host-spec", "1x-a100-80g", "--ds-config", path]
    result = CliRunner().invoke(cli, [*args, "--offload-optimizer", "none", "--dry-run"])
    assert result.exit_code == 2
    assert "--offload-optimizer none contradicts 'cpu' in --ds-config" in result.output
    agreeing = CliRunner().invoke(cli, [*args, "--offload-optimizer", "cpu", "--zero-stage", "3", "--dry-run"])
    assert agreeing.exit_code == 0, agreeing.output


def test_typed_auto_and_a_trailing_slash_do_not_contradict(tmp_path):
    config = dict(HF_STYLE, zero_optimization={"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})
    path = write(tmp_path, config)
    args = ["--model", "meta-llama/Llama-2-70b-hf", "--host-spec", "1x-a100-80g", "--ds-config", path, "--dry-run"]
    result = CliRunner().invoke(cli, [*args, "--zero-stage", "auto", "--nvme-path", "/x/", "--json"])
    assert "contradicts" not in result.output, result.output
