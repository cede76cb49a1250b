"""prepare(): from a plan and the settings to the RunSpec, the final ds_config and the launch command; write()
puts them in OUT. The bundled demo model and corpus on the described CPU-only host; nothing is launched."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from launcher import settings
from launcher.config.final import UserConfig, user_pins
from launcher.errors import UserInputError
from launcher.job import binding, prepare, rundir
from launcher.job.planning import build_plan
from launcher.job.spec import RunSpec
from tests.helpers import REPO, host_path

DEMO = REPO / "launcher" / "demo"
MODEL_AND_DATA = {"model": "tiny-llama", "data": "data/train.jsonl"}
NVME_HOST = "gpus: {count: 0}\ncpu_memory: 24GiB\ncpu_cores: 2\nnvme: {path: /mnt/described, free: 1TB}\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # OUT is the relative "out"


def demo_settings(pins=None, **typed):
    base = {name: str(DEMO / path) for name, path in MODEL_AND_DATA.items()} | {"output_dir": "out"}
    return settings.layer({**base, "host_spec": host_path("cpu-only"), **typed}, pins=pins)


def prepared(s, tokenize=False, **kw):
    return prepare.prepare(build_plan(s), s, output_dir=s.output_dir, tokenize=tokenize, **kw)


def test_run_spec_has_absolute_paths_and_the_plans_figures(tmp_path):
    relative = {name: os.path.relpath(DEMO / path, tmp_path) for name, path in MODEL_AND_DATA.items()}
    job = prepared(demo_settings(steps=7, seq_len=64, seed=5, **relative))
    spec, plan = job.spec, job.plan
    assert spec.output_dir == str(tmp_path / "out") and job.out == tmp_path / "out"
    assert spec.model == str(DEMO / "tiny-llama") and spec.data == str(DEMO / "data" / "train.jsonl")
    assert (spec.steps, spec.seq_len, spec.seed) == (7, 64, 5) == (plan.workload.steps, plan.workload.seq_len, 5)
    assert spec.predicted["step_seconds"] == plan.chosen.timing.step_seconds
    assert spec.predicted["cpu_bytes_per_node"] == plan.chosen.memory.cpu_bytes
    assert spec.nvme_swap_dir is None and job.n_blocks is None


def test_launch_command_runs_deepspeeds_launcher_on_the_rank_module(tmp_path):
    job = prepared(demo_settings(master_port=29555), launcher_args=("--force_multi",))
    assert job.argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert job.argv[-4:] == ["--module", "launcher.rank", "--run-spec", str(tmp_path / "out" / "run_spec.json")]
    joined = " ".join(job.argv)
    assert "--num_gpus 1 --master_port 29555" in joined and joined.index("--force_multi") < joined.index("--module")
    assert job.env["DS_ACCELERATOR"] == "cpu" and job.env["OMP_NUM_THREADS"] == "2"  # the host's 2 cores


def test_epochs_set_the_steps_and_the_schedule_length():
    job = prepared(demo_settings(epochs=2, micro_batch=2, grad_accum=3))
    steps = math.ceil(2 * job.n_blocks / (1 * 2 * 3))  # world 1 x micro-batch 2 x accumulation 3
    assert job.n_blocks > 0 and steps != 100  # not the default --steps
    assert job.plan.workload.steps == job.spec.steps == steps
    assert job.ds_config["scheduler"]["params"]["total_num_steps"] == steps + 1  # step k runs at iteration k


def test_steps_for_epochs_rounds_a_partial_step_up():
    plan = build_plan(demo_settings(micro_batch=2, grad_accum=3))  # 6 blocks per optimizer step
    assert prepare.steps_for_epochs(1, 60, plan) == 10
    assert prepare.steps_for_epochs(1, 61, plan) == 11
    assert prepare.steps_for_epochs(0.5, 60, plan) == 5
    assert prepare.steps_for_epochs(0.01, 60, plan) == 1


def test_steps_for_epochs_is_exact_when_the_passes_fill_whole_steps():
    plan = build_plan(demo_settings())  # 1 block per optimizer step
    assert prepare.steps_for_epochs(1.1, 100, plan) == 110
    assert prepare.steps_for_epochs(1.1, 200, replace(plan, workload=replace(plan.workload, micro_batch=2))) == 110


def test_without_tokenize_nothing_is_written(tmp_path):
    prepared(demo_settings(), tokenize=False)
    assert list(tmp_path.iterdir()) == []
    job = prepared(demo_settings(), tokenize=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in job.out.iterdir()] == ["cache"]
    assert job.n_blocks > 0


def test_write_puts_files_that_round_trip(tmp_path):
    job = prepared(demo_settings(steps=7))
    prepare.write(job)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["ds_config.json", "plan.json", "run_spec.json"]
    assert RunSpec.load(out / "run_spec.json") == job.spec
    assert json.loads((out / "ds_config.json").read_text()) == job.ds_config
    plan_json = json.loads((out / "plan.json").read_text())
    assert plan_json["ds_config"] == job.ds_config and plan_json["strategy"]["label"] == job.plan.chosen.strategy.label


def test_a_user_config_naming_a_drive_swaps_into_the_runs_own_folder(tmp_path, write_host):
    drive = str(tmp_path / "drive")
    offload = {"device": "nvme", "nvme_path": drive}
    user = UserConfig("mine.json", {"zero_optimization": {"stage": 3, "offload_optimizer": offload}})
    job = prepared(demo_settings(pins=user_pins(user), host_spec=write_host(NVME_HOST), seq_len=64), user=user)
    own = rundir.swap_dir(drive, "out")
    assert job.ds_config["zero_optimization"]["offload_optimizer"]["nvme_path"] == own != drive
    assert job.spec.nvme_swap_dir == own
    assert user.config["zero_optimization"]["offload_optimizer"]["nvme_path"] == drive  # the user's stays as is
    prepare.write(job)
    assert (tmp_path / "drive").is_dir() and [p.name for p in (tmp_path / "drive").iterdir()] == [own.split("/")[-1]]


# --- core binding: DeepSpeed's --bind_cores_to_rank, on by default when the optimizer steps on the CPU

OFFLOAD = {"zero_stage": "2", "offload_optimizer": "cpu"}


@pytest.fixture
def numactl(monkeypatch):
    """Whether numactl is on PATH, as prepare sees it (other look-ups unchanged)."""
    real = binding.shutil.which

    def set_installed(installed: bool) -> None:
        path = "/usr/bin/numactl" if installed else None
        monkeypatch.setattr(binding.shutil, "which", lambda name, *a, **k: path if name == "numactl" else real(name))

    return set_installed


def binding_for(**typed):
    s = demo_settings(**typed)
    return binding.core_binding(build_plan(s), s)


def test_binding_is_on_by_default_when_the_optimizer_is_offloaded_and_numactl_is_there(numactl):
    numactl(True)
    result = binding_for(**OFFLOAD)
    assert result.bind
    assert "numactl, DeepSpeed --bind_cores_to_rank" in result.note and "--no-bind-cores turns it off" in result.note


def test_binding_stays_off_by_default_without_optimizer_offload(numactl):
    numactl(True)
    assert binding_for(zero_stage="2", offload_optimizer="none") == binding.CoreBinding(False, None)


def test_without_numactl_the_default_is_off_and_says_installing_it_would_bind(numactl):
    numactl(False)
    result = binding_for(**OFFLOAD)
    assert not result.bind and "installing numactl (apt-get install numactl) would pin each" in result.note
    assert binding_for(zero_stage="2", offload_optimizer="none").note is None  # nothing to gain: nothing said


def test_bind_cores_typed_without_numactl_is_one_line_error(numactl):
    numactl(False)
    with pytest.raises(UserInputError, match=r"^--bind-cores needs numactl .*apt-get install numactl$"):
        binding_for(bind_cores=True, **OFFLOAD)


def test_typed_choices_win_and_need_no_note(numactl):
    numactl(True)
    assert binding_for(bind_cores=False, **OFFLOAD) == binding.CoreBinding(False, None)  # --no-bind-cores
    assert binding_for(bind_cores=True, zero_stage="2", offload_optimizer="none") == binding.CoreBinding(True, None)


def test_with_a_hostfile_binding_is_asked_for_not_assumed(numactl, tmp_path):
    numactl(False)  # this machine's numactl says nothing about the hosts': --bind-cores is not refused here
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node-a slots=1\nnode-b slots=1\n")
    auto = binding_for(hostfile=str(hosts), **OFFLOAD)
    assert not auto.bind and "with --hostfile" in auto.note and "--bind-cores pins each" in auto.note
    assert binding_for(hostfile=str(hosts), bind_cores=True, **OFFLOAD).bind


def test_binding_stays_off_where_deepspeed_would_fail(numactl, monkeypatch):
    """DeepSpeed's numa.py asserts a core per rank and refuses KMP_AFFINITY; on this machine (live) numactl
    itself must be allowed to bind (a container's seccomp profile or cpuset may refuse it)."""
    numactl(True)
    s = demo_settings(**OFFLOAD)
    plan = build_plan(s)
    one_core = replace(plan, ranks_per_node=2, host=replace(plan.host, cpu_cores=1))
    assert "1 core for 2 ranks, it needs one each" in binding.core_binding(one_core, s).note
    monkeypatch.setenv("KMP_AFFINITY", "compact")
    assert "KMP_AFFINITY" in binding.core_binding(plan, s).note and not binding.core_binding(plan, s).bind
    monkeypatch.delenv("KMP_AFFINITY")
    live = replace(plan, host=replace(plan.host, source="live"))
    refused = "numactl -m 0 -C 0-1 true: set_mempolicy: Operation not permitted"
    monkeypatch.setattr(binding, "numactl_problem", lambda cpus: refused if cpus == "0-1" else None)
    result = binding.core_binding(live, s)
    assert not result.bind and f"numactl cannot bind here ({refused})" in result.note
    assert binding.core_binding(live, s, ("--bind_core_list=0",)).bind  # the user's own cores: not probed
    assert binding.core_binding(plan, s).bind  # a described host is another machine: not probed here


def test_numactl_problem_quotes_numactls_own_words(monkeypatch):
    def run(argv, **kw):
        return binding.subprocess.CompletedProcess(argv, 1, "", "set_mempolicy: Operation not permitted\nusage\n")

    monkeypatch.setattr(binding.subprocess, "run", run)
    assert binding.numactl_problem("0-3") == "numactl -m 0 -C 0-3 true: set_mempolicy: Operation not permitted"
    monkeypatch.setattr(binding.subprocess, "run", lambda argv, **kw: binding.subprocess.CompletedProcess(argv, 0))
    assert binding.numactl_problem("0-3") is None


def test_the_job_launches_bound_and_keeps_each_ranks_thread_share(numactl):
    numactl(True)
    job = prepared(demo_settings(num_gpus=2, **OFFLOAD))
    assert "--bind_cores_to_rank" in job.argv and job.argv.index("--bind_cores_to_rank") < job.argv.index("--module")
    assert job.env["OMP_NUM_THREADS"] == "1"  # 2 cores / 2 ranks: what DeepSpeed's numa.py gives each too
    assert len(job.notes) == 1 and "--no-bind-cores" in job.notes[0]
    unbound = prepared(demo_settings(num_gpus=2, bind_cores=False, **OFFLOAD))
    assert "--bind_cores_to_rank" not in unbound.argv and unbound.notes == ()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or shutil.which("numactl") is None, reason="2 CPUs, numactl")
def test_under_an_affinity_mask_binding_names_the_allowed_cores(numactl):
    """Under `taskset -c 1` DeepSpeed's default binding (CPUs 0..physical cores-1) is CPUs numactl may not use and
    every rank dies at start: a live host's binding passes --bind_core_list with the allowed cores, and numactl
    really binds there (this process's own mask, set and restored)."""
    numactl(True)
    s = demo_settings(num_gpus=1, **OFFLOAD)
    plan = build_plan(s)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        live = replace(plan, host=replace(plan.host, source="live", cpu_cores=1))
        assert binding.core_binding(live, s).bind  # numactl -m 0 -C 1 true: allowed
        argv, env = prepare.launch.build_command(prepare.launch_spec(live, s, Path("out"), (), bind_cores=True))
        assert argv[argv.index("--bind_cores_to_rank") + 1 : argv.index("--bind_cores_to_rank") + 3] == [
            "--bind_core_list",
            "1",
        ]
        assert env["OMP_NUM_THREADS"] == "1"
        assert (
            prepare.launch_spec(live, s, Path("out"), ("--bind_core_list=0",), bind_cores=True).bind_core_list is None
        )
    finally:
        os.sched_setaffinity(0, before)
    assert prepare.launch_spec(live, s, Path("out"), (), bind_cores=True).bind_core_list is None  # 0-1: the default


def test_only_causal_and_seq2seq_models_train_and_each_with_data_it_can_learn(tmp_path):
    """A BERT-shaped encoder is planned (--dry-run without --data) but not trained; a T5 refuses text data, which
    has no response to learn; both before anything is tokenized."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    big = host_path("1x-a100-80g")
    bert = demo_settings(model="bert-large-uncased", host_spec=big)
    with pytest.raises(UserInputError, match=r"is a BertModel \(bert\): offload-launch trains causal LMs and "):
        prepared(bert)
    t5 = demo_settings(model="t5-11b", host_spec=big, seq_len=128)
    with pytest.raises(UserInputError, match=r"a sequence-to-sequence model trains on prompt/response pairs"):
        prepared(t5)  # the demo corpus is text
    with pytest.raises(UserInputError, match=r"not chat data"):
        prepared(replace(t5, data=str(chat)))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "a", "target": "b"}) + "\n")
    spec = prepared(replace(t5, data=str(pairs))).spec
    assert spec.model_kind == "seq2seq-lm" and spec.rows_layout().packing == "seq2seq"
    assert spec.rows_layout().format == "pairs"
