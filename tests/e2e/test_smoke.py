"""Smoke mode (--smoke) on the CPU accelerator: a passing run read back from its JUnit XML and JSON, a real
7B architecture cut to one layer, and each check made to fail once with its own exit code and message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e

SMOKE = ("--smoke", "--seq-len", "32", "--micro-batch", "2")


def smoke(model: Path, data: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """offload-launch --smoke (no TRAIN_ARGS: smoke's own defaults for steps and learning rate)."""
    argv = [sys.executable, "-m", "launcher", "--model", str(model), "--data", str(data), "--output-dir", str(out)]
    env = dict(os.environ, **(env or {}))
    return subprocess.run([*argv, *SMOKE, *extra], capture_output=True, text=True, timeout=900, cwd=REPO, env=env)


# A sitecustomize for the ranks (DeepSpeed's launcher passes PYTHONPATH on): it records every ZeRO-3
# GatheredParameters (elements gathered, and which launcher/rank function asked) and every swap-in of an
# optimizer sub-group from NVMe; with OFFLOAD_LAUNCH_PROBE_NO_REFRESH it disables the 16-bit refresh after a load.
PROBE = r'''"""sitecustomize for the ranks of an e2e run (tests/e2e/test_smoke.py PROBE)."""
import importlib.abc
import json
import os
import sys

LOG = os.environ.get("OFFLOAD_LAUNCH_PROBE_LOG")


def _record(**event):
    with open(LOG, "a") as f:
        f.write(json.dumps(event | {"pid": os.getpid()}) + "\n")


def _frames():
    frame = sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _caller():
    for frame in _frames():
        name = frame.f_code.co_filename.replace(os.sep, "/")
        if "/launcher/rank/" in name:
            return name.rsplit("/", 1)[-1] + ":" + frame.f_code.co_name
    return "other"


def _inside(function):
    return any(frame.f_code.co_name == function for frame in _frames())


def _partition_parameters(module):
    cls = module.GatheredParameters
    init = cls.__init__

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        init(self, params, modifier_rank, fwd_module, enabled)
        if self.enabled:
            _record(event="gather", numel=sum(p.ds_numel for p in self.params), caller=_caller())

    cls.__init__ = __init__


def _stage3(module):
    cls = module.DeepSpeedZeroOptimizer_Stage3
    swap_in = cls._optimizer_states_and_gradient_swap_in

    def counted(self, sub_group_id, timer_names=None):
        refresh = _inside("_refresh_16bit_weights")
        _record(event="swap_in", sub_group=sub_group_id, load=_inside("load"), refresh=refresh)
        return swap_in(self, sub_group_id, timer_names)

    cls._optimizer_states_and_gradient_swap_in = counted


def _checkpoints(module):
    if os.environ.get("OFFLOAD_LAUNCH_PROBE_NO_REFRESH"):
        module.CheckpointStore._refresh_16bit_weights = lambda self: None


HOOKS = {
    "deepspeed.runtime.zero.partition_parameters": _partition_parameters,
    "deepspeed.runtime.zero.stage3": _stage3,
    "launcher.rank.checkpoints": _checkpoints,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def hooked(module):
            exec_module(module)
            HOOKS[name](module)

        spec.loader.exec_module = hooked
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
'''


def probe_env(folder: Path, **extra: str) -> dict:
    """The environment that loads PROBE into every Python process of a run; the events go to folder/probe.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PROBE)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "OFFLOAD_LAUNCH_PROBE_LOG": str(folder / "probe.jsonl"), **extra}


def probe_events(folder: Path, event: str) -> list[dict]:
    path = folder / "probe.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == event]


def failed_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_passing_smoke_run_json_and_junit(tiny_model, tiny_data, tmp_path):
    xml = tmp_path / "reports" / "smoke.xml"
    proc = smoke(
        tiny_model,
        tiny_data,
        tmp_path / "out",
        "--json",
        "--junit-xml",
        str(xml),
        "--zero-stage",
        "2",
        "--offload-optimizer",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)  # stdout is exactly one object; the ranks' logs went to stderr
    assert report["passed"] and report["exit_code"] == 0 and report["strategy"] == "ZeRO-2 + opt->cpu"
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == [
        "config",
        "data",
        "engine",
        "loss",
        "memory",
        "checkpoint",
        "nvme_cleanup",
        "timeout",
        "run",
    ]
    assert all(c["status"] == "pass" for c in checks.values())
    assert checks["engine"]["details"]["optimizer"] == "DeepSpeedCPUAdam"
    losses = checks["loss"]["details"]["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert 0.5 < checks["memory"]["details"]["ratios"]["cpu_bytes_per_node"] <= 1.25
    assert "all" in checks["checkpoint"]["message"] and "identical" in checks["checkpoint"]["message"]

    suite = ET.parse(xml).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert suite.get("tests") == "9" and suite.get("failures") == "0"
    assert [c.get("name") for c in cases] == list(checks)
    assert not any(c.find("failure") is not None for c in cases)


def test_7b_architecture_cut_to_one_layer(tiny_model, tiny_data, tmp_path):
    from transformers import LlamaConfig

    config_only = tmp_path / "llama-2-7b-config"
    LlamaConfig(  # Llama-2-7B's published shapes; config only, no weights
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ).save_pretrained(config_only)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "--model",
            str(config_only),
            "--tokenizer",
            str(tiny_model),
            "--data",
            str(tiny_data),
            "--output-dir",
            str(out),
            "--smoke",
            "--smoke-layers",
            "1",
            "--seq-len",
            "8",
            "--micro-batch",
            "1",
            "--steps",  # two, the fewest whose loss can fall: a step of this 464 M-parameter cut is ~40 s here
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["passed"] and report["layers"] == 1
    assert report["full_model"]["layers"] == 32 and report["full_model"]["summary"]
    saved = json.loads((out / "smoke-model" / "config.json").read_text())
    assert (saved["num_hidden_layers"], saved["hidden_size"], saved["vocab_size"]) == (1, 4096, 32000)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"]["largest_param_numel"] == 32000 * 4096  # the real largest tensor, kept
    assert plan["model"]["params"] == 2 * 32000 * 4096 + 4096 + (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096)


def test_config_check_fails_when_the_plan_does_not_fit(tiny_model, tiny_data, tmp_path):
    host = tmp_path / "small.yaml"
    host.write_text("gpus: {count: 0}\ncpu_memory: 256MiB\ncpu_cores: 2\n")
    proc = smoke(tiny_model, tiny_data, tmp_path / "out", "--host-spec", str(host))
    assert proc.returncode == 10
    assert failed_line(proc).startswith("Error: smoke check 'config' failed: does not fit")
    assert not (tmp_path / "out" / "ds_config.json").exists()  # nothing launched


def test_data_check_fails_on_data_without_tokens(tiny_model, tmp_path):
    data = tmp_path / "blank.jsonl"
    data.write_text('{"text": ""}\n' * 20)
    proc = smoke(tiny_model, data, tmp_path / "out")
    assert proc.returncode == 11, proc.stderr[-3000:]
    assert failed_line(proc).startswith("Error: smoke check 'data' failed:")


def test_engine_check_fails_when_the_offloaded_optimizer_is_not_cpu_adam(tiny_model, tiny_data, tmp_path):
    user = tmp_path / "ds.json"  # a classic mistake: torch's Adam for an offloaded optimizer
    user.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
                "zero_force_ds_cpu_optimizer": False,
            }
        )
    )
    proc = smoke(tiny_model, tiny_data, tmp_path / "out", "--ds-config", str(user))
    assert proc.returncode == 12, proc.stderr[-3000:]
    line = failed_line(proc)
    assert "smoke check 'engine' failed" in line and "not DeepSpeedCPUAdam" in line


def test_loss_check_fails_on_a_nan_producing_learning_rate(tiny_model, tiny_data, tmp_path):
    proc = smoke(tiny_model, tiny_data, tmp_path / "out", "--lr", "1e30")
    assert proc.returncode == 13, proc.stderr[-3000:]
    line = failed_line(proc)
    # DeepSpeed skips the steps whose gradients overflow (the loss stays finite): the check catches both.
    assert "smoke check 'loss' failed:" in line and "not finite" in line and "lower --lr" in line


def test_memory_check_fails_when_the_prediction_is_held_too_low(tiny_model, tiny_data, tmp_path):
    proc = smoke(tiny_model, tiny_data, tmp_path / "out", "--smoke-memory-tolerance", "0.05")
    assert proc.returncode == 14, proc.stderr[-3000:]
    assert "smoke check 'memory' failed: CPU" in failed_line(proc) and "above the 0.05 tolerance" in proc.stderr


def test_checkpoint_check_fails_on_a_full_disk(tiny_model, tiny_data, tmp_path):
    out = tmp_path / "out"
    folder = out / "smoke-checkpoint"
    folder.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        proc = smoke(tiny_model, tiny_data, out)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    assert proc.returncode == 15, proc.stderr[-3000:]
    assert "smoke check 'checkpoint' failed" in failed_line(proc)


def test_timeout_fails_cleanly_and_leaves_no_rank(tiny_model, tiny_data, tmp_path):
    import psutil

    out = tmp_path / "out"
    proc = smoke(tiny_model, tiny_data, out, "--smoke-timeout", "0.05")  # 3 s: less than DeepSpeed's start-up
    assert proc.returncode == 17, proc.stderr[-3000:]
    assert "smoke check 'timeout' failed: stopped after 0.05 min" in failed_line(proc)
    spec = str(out.resolve() / "run_spec.json")
    assert not [p for p in psutil.process_iter(["cmdline"]) if spec in " ".join(p.info["cmdline"] or [])]


def test_run_check_fails_when_a_rank_dies(tiny_model, tiny_data, tmp_path):
    env = dict(os.environ, OFFLOAD_LAUNCH_KILL_AT="step:2")  # SIGKILL rank 0 in its second step
    argv = [sys.executable, "-m", "launcher", "--model", str(tiny_model), "--data", str(tiny_data)]
    proc = subprocess.run(
        [*argv, "--output-dir", str(tmp_path / "out"), *SMOKE],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 18, proc.stderr[-3000:]
    assert "smoke check 'run' failed: training processes exited" in failed_line(proc)
    assert "skip  loss" in proc.stdout  # the checks it never reached are reported as skipped


def test_nvme_cleanup_check_fails_when_the_swap_folder_stays(tiny_model, tiny_data, tmp_path):
    from launcher.inspection.host import aio_usable
    from launcher.job.rundir import swap_dir

    if not aio_usable():
        pytest.skip("DeepSpeed async_io is not usable here: install libaio-dev")
    nvme, out = tmp_path / "nvme", tmp_path / "out"
    busy = Path(swap_dir(str(nvme), str(out))) / "busy"  # a mount point inside the run's swap folder
    busy.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(busy)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        args = ("--zero-stage", "3", "--offload-optimizer", "cpu", "--offload-param", "nvme", "--nvme-path", str(nvme))
        proc = smoke(tiny_model, tiny_data, out, *args)
    finally:
        subprocess.run(["umount", "-l", str(busy)], check=False)
    assert proc.returncode == 16, proc.stderr[-3000:]
    assert "smoke check 'nvme_cleanup' failed" in failed_line(proc) and "is still there" in failed_line(proc)


def test_zero3_checkpoint_check_gathers_one_tensor_at_a_time(tiny_model, tiny_data, tmp_path):
    """ZeRO-3 with the optimizer on NVMe: the checkpoint check never gathers more than the largest tensor (it
    gathered the whole model, three times), and the load's 16-bit refresh swaps each optimizer sub-group in once
    (it swapped a sub-group in per parameter; this tiny model's one sub-group is below DeepSpeed's min_aio_bytes
    and stays in memory, so here both counts are 0: tests/rank/test_checkpoints.py counts them on fakes)."""
    from transformers import AutoConfig

    from launcher.inspection.host import aio_usable

    if not aio_usable():
        pytest.skip("DeepSpeed async_io is not usable here: install libaio-dev")
    config = AutoConfig.from_pretrained(tiny_model)
    largest = config.vocab_size * config.hidden_size  # the embedding and the LM head
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    args = ("--zero-stage", "3", "--offload-optimizer", "nvme", "--nvme-path", str(nvme), "--json")
    probe = tmp_path / "probe"
    proc = smoke(tiny_model, tiny_data, tmp_path / "out", *args, env=probe_env(probe))
    gathered = [e["numel"] for e in probe_events(probe, "gather") if e["caller"].startswith("smoke_checks.py")]
    assert gathered and max(gathered) == largest, (gathered, largest)  # was 143,680: the whole model
    swaps = probe_events(probe, "swap_in")
    assert sorted(e["sub_group"] for e in swaps if e["refresh"]) == sorted({e["sub_group"] for e in swaps})
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["checkpoint"]["status"] == "pass", checks["checkpoint"]["message"]
    assert proc.returncode == 0, proc.stderr[-4000:]
