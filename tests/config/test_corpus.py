"""The ds_config corpus (tests/config/corpus/, its README.md names each file's source): configs as the Hugging Face
docs, LLaMA-Factory, axolotl and DeepSpeedExamples ship them. Each has the exact findings `offload-launch check`
must give it (CORPUS); an error is something DeepSpeed refuses, a warning something it accepts and ignores, a note
a value it reads differently from how it is written - each level checked against DeepSpeed itself here. The
configs DeepSpeed accepts plan and dry-run with --ds-config, and their filled configs pass DeepSpeed's models."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.config import dsconfig, lint
from launcher.config.keys import _zero_models
from launcher.config.lint_keys import STAGES_READING
from launcher.deepspeed_logging import import_deepspeed
from tests.helpers import offload_launch

CORPUS_DIR = Path(__file__).parent / "corpus"
TINY, LLAMA7B = "launcher/demo/tiny-llama", "meta-llama/Llama-2-7b"
HOST_24GB = "1x-rtx4090-24g-192g"  # a 24 GB GPU (with the RAM and NVMe a 7B offload needs)
DOES_NOTHING = "does nothing at ZeRO stage"
NO_OPTIMIZER = "offload_optimizer without an optimizer section"  # the HF Trainer's client optimizer: see lint.py


def reads(*pairs: tuple[str, str]) -> dict:
    """Notes for 1e9-style floats a DeepSpeed model reads as integers: (path, "1000000000.0 as 1000000000")."""
    return {("note", path): f"DeepSpeed reads {value}" for path, value in pairs}


Z = "zero_optimization."
BUCKETS_5E8 = reads(
    (Z + "allgather_bucket_size", "500000000.0 as 500000000"), (Z + "reduce_bucket_size", "500000000.0 as 500000000")
)
ZERO3_1E9 = reads(
    (Z + "sub_group_size", "1000000000.0 as 1000000000"),
    (Z + "stage3_max_live_parameters", "1000000000.0 as 1000000000"),
    (Z + "stage3_max_reuse_distance", "1000000000.0 as 1000000000"),
)
NVME_1E9 = ZERO3_1E9 | reads(
    (Z + "offload_param.buffer_size", "100000000.0 as 100000000"),
    (Z + "offload_param.max_in_cpu", "1000000000.0 as 1000000000"),
)
# (level, path) -> a fragment of the message: exactly these findings, no others
CORPUS = {
    "axolotl_zero1.json": {},
    "axolotl_zero2.json": {("warning", "optimizer"): NO_OPTIMIZER},
    "axolotl_zero3.json": {},  # sub_group_size 0, max_live_parameters 0: valid, DeepSpeed's Field(ge=0)
    "axolotl_zero3_bf16.json": {},
    "axolotl_zero3_bf16_cpuoffload_all.json": {},  # zero_force_ds_cpu_optimizer false: the client optimizer is fine
    "axolotl_zero3_bf16_cpuoffload_params.json": {},
    "dschat_step1_zero2_bf16.json": {
        ("warning", "bfloat16"): "deprecated in DeepSpeed; use bf16",
        # DeepSpeed-Chat writes ZeRO-3's keys whatever the stage: at stage 2 nothing reads them
        ("warning", Z + "stage3_param_persistence_threshold"): DOES_NOTHING + " 2: DeepSpeed reads it at stage 3 only",
        ("warning", Z + "stage3_max_live_parameters"): DOES_NOTHING + " 2",
        ("warning", Z + "stage3_prefetch_bucket_size"): DOES_NOTHING + " 2",
        ("warning", Z + "memory_efficient_linear"): DOES_NOTHING + " 2",
    },
    "dschat_step1_zero3_offload_bf16.json": {
        ("warning", "bfloat16"): "deprecated in DeepSpeed; use bf16",
        ("warning", "optimizer"): NO_OPTIMIZER,  # DeepSpeed-Chat passes DeepSpeedCPUAdam itself
        **reads(
            (Z + "stage3_param_persistence_threshold", "10000.0 as 10000"),
            (Z + "stage3_max_live_parameters", "30000000.0 as 30000000"),
            (Z + "stage3_prefetch_bucket_size", "30000000.0 as 30000000"),
        ),
    },
    "dsexamples_cifar_stage0_fp16.json": {
        ("warning", Z + "cpu_offload"): "deprecated in DeepSpeed; use offload_optimizer",
        ("warning", Z + "reduce_bucket_size"): DOES_NOTHING + " 0: DeepSpeed reads it at stages 1, 2 and 3 only",
        ("warning", Z + "overlap_comm"): DOES_NOTHING + " 0",
    },
    "dsexamples_imagenet_ds_fp16_z1_config.json": {
        ("warning", "cuda_visible_devices"): "does nothing: DeepSpeed ignores the unknown key 'cuda_visible_devices'"
    },
    "hf_docs_nvme.json": {
        ("error", Z + "aio"): "'aio' is a top-level section, not a key of 'zero_optimization': move it to the top",
        **NVME_1E9,
    },
    "hf_docs_nvme_aio_top_level.json": {
        ("warning", "aio.thread_count"): "old name of intra_op_parallelism (renamed in DeepSpeed 0.16.4; newer "
        'versions ignore it); write "intra_op_parallelism": 1',
        **NVME_1E9,
    },
    "hf_docs_zero2.json": reads(
        (Z + "allgather_bucket_size", "200000000.0 as 200000000"), (Z + "reduce_bucket_size", "200000000.0")
    ),
    "hf_docs_zero3.json": ZERO3_1E9,
    "hf_tests_zero3.json": {
        ("warning", Z + "stage3_gather_fp16_weights_on_model_save"): "deprecated in DeepSpeed; use gather_16bit",
        **ZERO3_1E9,
        **reads((Z + "sub_group_size", "100000000000000.0 as 100000000000000")),
    },
    "llamafactory_ds_z0_config.json": {
        ("warning", Z + "round_robin_gradients"): DOES_NOTHING + " 0: DeepSpeed reads it at stages 1 and 2 only",
        **BUCKETS_5E8,
    },
    "llamafactory_ds_z2_config.json": BUCKETS_5E8,
    "llamafactory_ds_z2_offload_config.json": {("warning", "optimizer"): NO_OPTIMIZER, **BUCKETS_5E8},
    "llamafactory_ds_z3_config.json": ZERO3_1E9,
    "llamafactory_ds_z3_offload_config.json": {("warning", "optimizer"): NO_OPTIMIZER, **ZERO3_1E9},
}
REFUSED = sorted(name for name, expected in CORPUS.items() if any(level == "error" for level, _ in expected))
ACCEPTED = sorted(set(CORPUS) - set(REFUSED))


def load(name: str) -> dict:
    return json.loads((CORPUS_DIR / name).read_text())


def test_every_corpus_file_has_its_expected_findings():
    assert sorted(p.name for p in CORPUS_DIR.glob("*.json")) == sorted(CORPUS)
    assert REFUSED == ["hf_docs_nvme.json"]


# ------------------------------------------------------------------------------------------ findings


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_check_gives_exactly_the_expected_findings(name):
    args = ["check", str(CORPUS_DIR / name), "--model", TINY, "--host-spec", HOST_24GB, "--json"]
    result = CliRunner().invoke(cli, args)
    report, _ = json.JSONDecoder().raw_decode(result.output)  # then, with errors, the one-line refusal
    findings = {(f["level"], f["path"]): f["message"] for f in report["findings"]}
    expected = CORPUS[name]
    assert set(findings) == set(expected), json.dumps(report["findings"], indent=1)
    for key, fragment in expected.items():
        assert fragment in findings[key], (key, findings[key])
    levels = [f["level"] for f in report["findings"]]
    assert (report["errors"], report["warnings"], report["notes"]) == tuple(
        levels.count(level) for level in ("error", "warning", "note")
    )
    assert result.exit_code == (2 if report["errors"] else 0), result.output


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_deepspeed_refuses_exactly_the_configs_with_errors(name):
    # DeepSpeedConfig itself, with "auto" dropped as its models drop it (lint._deepspeed_findings)
    refused = lint._deepspeed_findings(load(name))
    assert bool(refused) == (name in REFUSED), refused
    if refused:  # the nested aio: DeepSpeedZeroConfig's extra="forbid"
        assert "aio" in refused[0].message and "Extra inputs are not permitted" in refused[0].message


def _parsed(config: dict) -> object:
    """What DeepSpeedConfig makes of a config (every attribute but the raw dict), as plain data."""
    import_deepspeed()
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import BaseModel

    def plain(value, depth=0):
        if isinstance(value, BaseModel):
            return plain(value.model_dump(), depth + 1)
        if isinstance(value, dict):
            return {str(k): plain(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v, depth + 1) for v in value]
        if isinstance(value, (bool, int, float, str, type(None))):
            return value
        if hasattr(value, "__dict__") and depth < 6:
            return {k: plain(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
        return repr(value)

    probe = lint._without_auto(config)
    if not {"train_batch_size", "train_micro_batch_size_per_gpu"} & set(probe):
        probe["train_micro_batch_size_per_gpu"] = 1  # "auto" ones, dropped: the HF Trainer fills them
    parsed = DeepSpeedConfig(probe)
    return plain({k: v for k, v in vars(parsed).items() if k != "_param_dict"})


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_key_warned_as_ignored_changes_nothing_deepspeed_parses(name):
    config = load(name)
    ignored = lint.ignored_paths(config)
    assert set(ignored) <= {path for level, path in CORPUS[name] if level == "warning"}  # each one is warned about
    assert _parsed(config) == _parsed(dsconfig._without(config, ignored))


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_float_noted_is_the_integer_deepspeed_reads(name):
    config = load(name)
    written = copy.deepcopy(config)
    for note in (f for f in lint.lint(config, None, 1, deepspeed=False) if f.level == "note"):
        *parents, key = note.path.split(".")
        node = written
        for part in parents:
            node = node[part]
        assert isinstance(node[key], float) and node[key].is_integer()
        node[key] = int(node[key])
    # 1e9 and 1000000000 are the same config to DeepSpeed, field by field (ints, not equal floats)
    assert json.dumps(_parsed(config), sort_keys=True) == json.dumps(_parsed(written), sort_keys=True)


def test_the_stage_table_is_where_the_engine_reads_each_field():
    # engine.py _configure_zero_optimizer: the stage-1/2 branch before `elif zero_stage == ZeroStageEnum.weights`,
    # the ZeRO-3 branch after it; zero.Init (partition_parameters.py) reads the rest of ZeRO-3's
    import_deepspeed()
    from deepspeed.runtime import engine
    from deepspeed.runtime.zero import partition_parameters, stage_1_and_2

    source = inspect.getsource(engine.DeepSpeedEngine._configure_zero_optimizer)
    stage12, stage3 = source.split("elif zero_stage == ZeroStageEnum.weights:")
    accessor = {"use_multi_rank_bucket_allreduce": "zero_multi_rank_bucket_allreduce"}
    zero_init = {"memory_efficient_linear", "use_all_reduce_for_fetch_params", "allgather_sequential"}
    for name, stages in STAGES_READING.items():
        call = accessor.get(name, name if name.startswith("zero_") else f"zero_{name}") + "()"
        if stages == (1, 2) or stages == (0, 1, 2):
            assert call in stage12 and call not in stage3, name
        elif stages == (1, 2, 3):
            assert call in stage12 and call in stage3, name
        elif name in zero_init:
            assert f"zero_config.{name}" in inspect.getsource(partition_parameters), name
            assert name not in inspect.getsource(stage_1_and_2), name
        elif name == "gather_16bit_weights_on_model_save":
            save = inspect.getsource(engine.DeepSpeedEngine.save_16bit_model)
            assert "if self.zero_optimization_partition_weights():" in save and call in save
        elif stages == (3,):
            assert call in stage3 and call not in stage12, name
        else:  # allgather_partitions: an accessor nothing calls
            assert stages == () and call not in inspect.getsource(engine), name
    assert "allgather_bucket_size=self.zero_allgather_bucket_size()" in inspect.getsource(
        engine.DeepSpeedEngine._configure_bf16_optimizer
    )  # read at stage 0 too


def _schema_node(schema: dict, path: str, resolve) -> dict:
    node = schema
    for part in path.split("."):
        node = resolve(node)["properties"][part]
    return node


def test_deepspeed_refuses_exactly_the_unknown_keys_the_lint_calls_errors():
    # every section the schema lists: a typo in it is an error iff DeepSpeedConfig refuses it
    import_deepspeed()
    schema = dsconfig._schema_validator().schema

    def resolve(node):
        while isinstance(node, dict) and "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        return node

    def sections(node, path, depth=0):
        node = resolve(node)
        if depth > 6 or not isinstance(node, dict):
            return
        if path and "properties" in node:
            yield path
        for key, sub in node.get("properties", {}).items():
            yield from sections(sub, f"{path}.{key}" if path else key, depth + 1)

    checked = 0
    for section in sections(schema, ""):
        if resolve(_schema_node(schema, section, resolve)).get("additionalProperties") is not False:
            continue  # optimizer.params: the optimizer's own keyword arguments, not listed
        config = {"train_micro_batch_size_per_gpu": 1}
        node = config
        *parents, last = section.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = {"zz_typo": 1}
        levels = {f.level for f in lint.lint(config, None, 1, deepspeed=False) if f.path == f"{section}.zz_typo"}
        refused = bool(dsconfig.deepspeed_errors(config))
        assert levels == ({"error"} if refused else {"warning"}), section
        checked += 1
    assert checked > 25


# ------------------------------------------------------------------------------------------ --ds-config dry runs

# (file, model, exit code, why): every config DeepSpeed accepts plans and dry-runs on a 24 GB host with a tiny model;
# the ZeRO-3 ones also with Llama-2-7B, where 0 is a plan that fits, 3 a plan that honestly does not (no optimizer
# offload: 7B's fp32 Adam states alone are ~100 GiB, more than the 24 GB GPU), and 2 a config DeepSpeed refuses.
NO_OFFLOAD_7B = "ZeRO-3 without optimizer offload: 7B's optimizer states do not fit on 24 GB"
DRY_RUNS = [(name, TINY, 0, "accepted") for name in ACCEPTED] + [
    ("hf_docs_nvme.json", TINY, 2, "DeepSpeedZeroConfig refuses the nested aio section"),
    ("hf_docs_zero3.json", LLAMA7B, 0, "ZeRO-3 with optimizer and parameters on the CPU"),
    ("hf_tests_zero3.json", LLAMA7B, 0, "ZeRO-3 with optimizer and parameters on the CPU"),
    ("llamafactory_ds_z3_offload_config.json", LLAMA7B, 0, "ZeRO-3 with optimizer and parameters on the CPU"),
    ("axolotl_zero3_bf16_cpuoffload_all.json", LLAMA7B, 0, "ZeRO-3 with optimizer and parameters on the CPU"),
    ("dschat_step1_zero3_offload_bf16.json", LLAMA7B, 0, "ZeRO-3 with optimizer and parameters on the CPU"),
    ("llamafactory_ds_z3_config.json", LLAMA7B, 3, NO_OFFLOAD_7B),
    ("axolotl_zero3.json", LLAMA7B, 3, NO_OFFLOAD_7B),
    ("axolotl_zero3_bf16.json", LLAMA7B, 3, NO_OFFLOAD_7B),
    ("axolotl_zero3_bf16_cpuoffload_params.json", LLAMA7B, 3, NO_OFFLOAD_7B),
    # DeepSpeed dies at init: buffer_size 1e8 is below Llama-2-7B's embedding (131,072,000 elements)
    ("hf_docs_nvme_aio_top_level.json", LLAMA7B, 2, "offload_param.buffer_size below the largest parameter"),
    ("hf_docs_nvme.json", LLAMA7B, 2, "DeepSpeedZeroConfig refuses the nested aio section"),
]


def _dry_run(name: str, model: str):
    args = ["--model", model, "--ds-config", str(CORPUS_DIR / name), "--dry-run", "--host-spec", HOST_24GB, "--json"]
    return CliRunner().invoke(cli, args)


def _integers_only(node) -> bool:
    if isinstance(node, dict):
        return all(_integers_only(v) for v in node.values())
    if isinstance(node, list):
        return all(_integers_only(v) for v in node)
    return not (isinstance(node, float) and node.is_integer() and node >= 1000) and node != "auto"


@pytest.mark.parametrize(("name", "model", "exit_code", "why"), DRY_RUNS, ids=lambda v: str(v)[:40])
def test_dry_run_with_the_config(name, model, exit_code, why):
    result = _dry_run(name, model)
    assert result.exit_code == exit_code, (why, result.output[-3000:])
    assert "Traceback" not in result.output
    if exit_code == 0:
        plan = json.loads(result.stdout)
        config = plan["ds_config"]
        assert config["zero_optimization"].get("stage", 0) == load(name).get("zero_optimization", {}).get("stage")
        assert _integers_only(config)  # 1e9 written as the integer DeepSpeed reads, every "auto" filled
    elif exit_code == 3:
        assert "does not fit this host" in result.output
    else:
        assert "Error: --ds-config: zero_optimization." in result.output


@pytest.mark.parametrize("name", ["llamafactory_ds_z3_config.json", "hf_docs_zero3.json"])
def test_the_real_cli_dry_runs_the_zero3_configs(name):
    proc = offload_launch("--model", TINY, "--ds-config", str(CORPUS_DIR / name), "--dry-run", "--host-spec", HOST_24GB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "a float where DeepSpeed needs an integer" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ACCEPTED)
def test_deepspeed_models_accept_the_filled_config(name):
    # the config a run would use: the user's, "auto" filled from the plan and 1e9 written as DeepSpeed reads it;
    # dsconfig.validate checked it (schema without the keys DeepSpeed ignores, then DeepSpeedConfig), and here
    # DeepSpeed's models take it again, section by section
    result = _dry_run(name, TINY)
    config = json.loads(result.stdout)["ds_config"]
    assert dsconfig.deepspeed_errors(copy.deepcopy(config)) == []
    zero_model, _, _ = _zero_models()
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config

    zero = zero_model(**config.get("zero_optimization", {}))
    original = load(name).get("zero_optimization", {})
    for key in ("sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance", "reduce_bucket_size"):
        if isinstance(original.get(key), float):  # 1e9: the integer DeepSpeed reads, in the config and the model
            assert config["zero_optimization"][key] == getattr(zero, key.removeprefix("stage3_")) == original[key]
    DeepSpeedFP16Config(**config.get("fp16", {}))
    DeepSpeedBF16Config(**config.get("bf16", config.get("bfloat16", {})))
    enabled = [config.get(k, {}).get("enabled") for k in ("fp16", "bf16", "bfloat16")]
    assert enabled.count(True) == 1  # the plan's precision, never fp32 from an "auto" left off
