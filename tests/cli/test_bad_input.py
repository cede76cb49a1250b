"""Every bad input, through the real CLI on the training path (`--data` given): exit 2 (3 when nothing fits)
before any DeepSpeed process starts, one line that names the value and what to do instead, no traceback,
and nothing written: the working folder holds exactly the inputs the test made, and no output folder."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import settings
from launcher.cli import cli
from launcher.inspection import host as host_module
from launcher.job import launch, planning, preflight
from launcher.job.planning import build_plan
from launcher.units import GB
from tests.helpers import REPO, host_path, save_config, tiny_llama_config

DEMO_MODEL = REPO / "launcher" / "demo" / "tiny-llama"
DOCS = ["ZeRO-3 partitions the parameters.", "CPU-Adam updates the optimizer states in host RAM."]
HOSTS = {  # described hosts, each wrong in one way (line numbers are part of the expected message)
    "host-missing.yaml": "gpus: {count: 1, memory: 24GiB}\n",
    "host-unknown.yaml": "gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64GiB\ncpu_memroy: 1\n",
    "host-negative.yaml": "cpu_memory: 64GiB\ngpus: {count: 1, memory: -24GiB}\n",
    "host-bare-int.yaml": "gpus: {count: 1, memory: 24}\ncpu_memory: 64GiB\n",
    "host-bare-float.yaml": "gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64.5\n",
    "host-syntax.yaml": "gpus: {count: 1, memory: 24GiB\ncpu_memory: 64GiB\n",
    "host-small.yaml": "gpus: {count: 1, memory: 8GiB}\ncpu_memory: 16GiB\n",
}


class Launched(Exception):
    """Raised by the stand-in for launch.run: reaching it means a DeepSpeed process would have started."""


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # after `--data DATA --output-dir out`, relative to the working folder
    message: tuple[str, ...]  # substrings of the one error line: the value and the remedy
    exit_code: int = 2
    host: str | None = "cpu-only"  # --host-spec: a shipped name or a file made here (None: probe this machine)
    data: str = "data.jsonl"
    nvme_free_bytes: int | None = None  # free space the NVMe folder reports (a small drive)
    stdout: tuple[str, ...] = field(default=())  # exit 3: the numbers in the candidates table
    max_seconds: float = 60  # generous: the first case in a process pays for importing torch and transformers
    # the torch the ranks would run (planning.installed_torch_version; None: this machine's): from 2.13 a CUDA plan
    # sets host_buffers.PINNED_ALLOC_CONF and counts pinned buffers unrounded, before it torch's power-of-two rounding
    torch: str | None = None
    without_peft: bool = False  # peft not installed (importlib finds no spec for it)


MODEL = ("--model", "model")
CASES = [
    # --lora
    Case(
        "lora-without-peft",
        (*MODEL, "--lora"),
        ("--lora trains with peft, which is not installed", "pip install 'offload-launch[adapters]'"),
        without_peft=True,
    ),
    Case(
        "lora-unknown-target",
        (*MODEL, "--lora", "--lora-target", "q_proj,qkv"),
        ("--lora-target: qkv is not a linear layer of model", "it has q_proj, k_proj, v_proj, o_proj"),
    ),
    Case("lora-rank-without-lora", (*MODEL, "--lora-rank", "16"), ("--lora-rank shape a LoRA adapter: add --lora",)),
    # --model
    Case("model-missing", ("--model", "./no-such-model"), ("model path ./no-such-model does not exist", "a hub id")),
    Case(
        "model-no-config",
        ("--model", "no-config"),
        ("no config.json in no-config", "pass a directory holding a Hugging Face config, or a hub id"),
    ),
    Case(
        "model-malformed-config",
        ("--model", "bad-config"),
        ("malformed bad-config/config.json", "at line 1", "fix the JSON"),
    ),
    Case(
        "model-unknown-hub-id",
        ("--model", "nobody/no-such-model"),
        ("unknown model 'nobody/no-such-model'", "(offline)", "check the id", "bundled ids: "),
        max_seconds=5,  # offline: no hub retries
    ),
    Case(
        "model-unknown-architecture",
        ("--model", "unknown-arch"),
        ("model_type 'definitely-not-a-model'", "--trust-remote-code"),
    ),
    Case(
        "model-needs-remote-code",
        ("--model", "remote-code"),
        ("architecture 'my-remote-model' needs the model's own code", "rerun with --trust-remote-code"),
    ),
    # --data
    Case(
        "data-missing",
        MODEL,
        ("data path no-data.jsonl does not exist", "pass a datasets save_to_disk folder"),
        data="no-data.jsonl",
    ),
    Case("data-empty-file", MODEL, ("data file empty.jsonl is empty", "add records"), data="empty.jsonl"),
    Case(
        "data-empty-folder",
        MODEL,
        ("data folder empty-data is empty", "put a datasets save_to_disk"),
        data="empty-data",
    ),
    Case(
        "data-unsupported-format",
        MODEL,
        ("unsupported data format '.xml' for data.xml", ".jsonl, .json, .txt, .parquet or .csv"),
        data="data.xml",
    ),
    Case(
        "data-missing-field",
        (*MODEL, "--text-field", "content"),
        ("no 'content' field", "its fields are title, body", "pass --text-field"),
        data="fields.jsonl",
    ),
    # --nvme-path on this machine (probed)
    Case(
        "nvme-missing",
        (*MODEL, "--nvme-path", "no-nvme"),
        ("--nvme-path no-nvme does not exist", "mkdir -p no-nvme"),
        host=None,
    ),
    Case(
        "nvme-not-a-directory",
        (*MODEL, "--nvme-path", "data.jsonl"),
        ("--nvme-path data.jsonl is not a directory", "pass a folder"),
        host=None,
    ),
    Case(
        "nvme-not-writable",
        (*MODEL, "--nvme-path", "read-only"),
        ("--nvme-path read-only is not writable by this user", "pick a folder you can write to"),
        host=None,
    ),
    # --nvme-path with a described host: the plan saw the description, the launch would use this folder
    Case(
        "nvme-missing-described-host",
        (*MODEL, "--offload-optimizer", "nvme", "--nvme-path", "no-nvme"),
        ("--nvme-path no-nvme does not exist", "mkdir -p no-nvme"),
        host="1x-a100-80g",
    ),
    Case(
        "nvme-too-small",
        ("--model", "meta-llama/Llama-2-70b-hf", "--offload-optimizer", "nvme", "--nvme-path", "nvme"),
        (
            "--nvme-path nvme has 9.3 GiB free",
            # torch 2.13: the pinned buffers are not rounded, params fit 512 GiB of RAM; the optimizer's swap files
            "ZeRO-3 + opt->nvme + param->cpu needs 1.0 TiB of swap files",
            "at least 1.1 TiB free",
        ),
        host="1x-a100-80g",
        nvme_free_bytes=10 * GB,
        torch="2.13.0",
    ),
    Case(
        "nvme-too-small-rounded",
        ("--model", "meta-llama/Llama-2-70b-hf", "--offload-optimizer", "nvme", "--nvme-path", "nvme"),
        (
            "--nvme-path nvme has 9.3 GiB free",
            # older torch rounds the pinned buffers: param->cpu no longer fits 512 GiB (the flat 16-bit params
            # and gradients, 128.5 GiB each, round to 256 GiB each), so the params swap too
            "ZeRO-3 + opt->nvme + param->nvme needs 1.1 TiB of swap files",
            "at least 1.2 TiB free",
        ),
        host="1x-a100-80g",
        nvme_free_bytes=10 * GB,
        torch="2.12.0",
    ),
    # ... and on this machine the plan itself measures the folder: nothing fits (exit 3), the table says why
    Case(
        "nvme-too-small-probed",
        ("--model", "meta-llama/Llama-2-70b-hf", "--offload-optimizer", "nvme", "--nvme-path", "nvme"),
        ("meta-llama/Llama-2-70b-hf does not fit this host",),
        exit_code=3,
        host=None,
        nvme_free_bytes=10 * GB,
        stdout=("ZeRO-3 + opt->nvme", "NVMe needs 1.0 TiB > 8.8 GiB free"),
    ),
    # --host-spec
    Case(
        "host-missing-key",
        (*MODEL, "--host-spec", "host-missing.yaml"),
        ("host-missing.yaml: missing required key 'cpu_memory'", "add it, e.g. 'cpu_memory: 512GiB'"),
        host=None,
    ),
    Case(
        "host-unknown-key",
        (*MODEL, "--host-spec", "host-unknown.yaml"),
        ("unknown key 'cpu_memroy'", "host-unknown.yaml:3", "did you mean 'cpu_memory'?"),
        host=None,
    ),
    Case(
        "host-negative-size",
        (*MODEL, "--host-spec", "host-negative.yaml"),
        ("host-negative.yaml:2: gpus.memory: size must not be negative, got '-24GiB'",),
        host=None,
    ),
    Case(
        "host-unit-less-integer",
        (*MODEL, "--host-spec", "host-bare-int.yaml"),
        ("host-bare-int.yaml:1: gpus.memory: 24 has no unit", "write it with a unit, e.g. '24GiB'"),
        host=None,
    ),
    Case(
        "host-unit-less-float",
        (*MODEL, "--host-spec", "host-bare-float.yaml"),
        ("host-bare-float.yaml:2: cpu_memory: a bare number 64.5 has no unit", "e.g. '64.5GB'"),
        host=None,
    ),
    Case(
        "host-bad-yaml",
        (*MODEL, "--host-spec", "host-syntax.yaml"),
        ("host-syntax.yaml:2: invalid YAML", "fix the syntax on that line"),
        host=None,
    ),
    # impossible numbers
    Case("micro-batch-0", (*MODEL, "--micro-batch", "0"), ("--micro-batch must be at least 1, got 0",)),
    Case("grad-accum-0", (*MODEL, "--grad-accum", "0"), ("--grad-accum must be at least 1, got 0",)),
    Case("steps-0", (*MODEL, "--steps", "0"), ("--steps must be at least 1, got 0",)),
    Case(
        "seq-len-above-model-maximum",
        (*MODEL, "--seq-len", "512"),
        ("--seq-len 512 exceeds", "max_position_embeddings 256", "use at most 256", "--allow-long-seq"),
    ),
    # contradictory flags
    Case(
        "offload-param-with-zero-2",
        (*MODEL, "--offload-param", "cpu", "--zero-stage", "2"),
        ("--offload-param cpu needs ZeRO-3", "drop --zero-stage 2 or use --offload-param none"),
    ),
    Case("nvme-offload-without-path", (*MODEL, "--offload-optimizer", "nvme"), ("needs --nvme-path DIR",)),
    # a forced strategy that does not fit: exit 3, the table carries the numbers
    Case(
        "forced-strategy-does-not-fit",
        ("--model", "meta-llama/Llama-2-7b-hf", "--zero-stage", "2", "--offload-optimizer", "cpu"),
        ("meta-llama/Llama-2-7b-hf does not fit this host",),
        exit_code=3,
        host="host-small.yaml",
        stdout=("ZeRO-2 + opt->cpu", "GPU needs", "GiB usable", "CPU RAM needs"),
    ),
    # an output folder this tool did not make, or whose checkpoint another run's settings would misread
    Case(
        "output-dir-not-made-by-the-tool",
        (*MODEL, "--output-dir", "thesis"),
        ("thesis is not empty and offload-launch did not make it (it holds chapter1.tex)", "or --force"),
    ),
    Case(
        "output-dir-force-over-a-tool-name",
        (*MODEL, "--output-dir", "theirs", "--force"),
        ("--force cannot use theirs: final is a name offload-launch writes", "move it or pass another --output-dir"),
    ),
    Case(
        "resume-with-another-seq-len",
        (*MODEL, "--output-dir", "seq-len-64-run", "--seq-len", "128"),
        (
            "cannot resume seq-len-64-run from its checkpoint at step 2: --seq-len is 128",
            "--no-resume to start over",
        ),
    ),
]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch) -> Path:
    """The working folder with every input the cases name; cwd is inside it."""
    model = save_config(tiny_llama_config(vocab_size=891), tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / name, model / name)
    write_jsonl(tmp_path / "data.jsonl", [{"text": doc} for doc in DOCS * 20])
    write_jsonl(tmp_path / "fields.jsonl", [{"title": "t", "body": doc} for doc in DOCS])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty-data").mkdir()
    (tmp_path / "data.xml").write_text("<text>hello</text>\n")
    (tmp_path / "no-config").mkdir()
    (tmp_path / "bad-config").mkdir()
    (tmp_path / "bad-config" / "config.json").write_text('{"model_type": "llama",')
    (tmp_path / "unknown-arch").mkdir()
    (tmp_path / "unknown-arch" / "config.json").write_text('{"model_type": "definitely-not-a-model"}')
    (tmp_path / "remote-code").mkdir()
    (tmp_path / "remote-code" / "config.json").write_text(
        json.dumps({"model_type": "my-remote-model", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}})
    )
    (tmp_path / "nvme").mkdir()
    (tmp_path / "read-only").mkdir(mode=0o500)
    for name, text in HOSTS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("mine")
    (tmp_path / "theirs" / "final").mkdir(parents=True)
    (tmp_path / "theirs" / "final" / "thesis.txt").write_text("mine")
    seq_len_64_run(tmp_path / "seq-len-64-run", model, tmp_path / "data.jsonl")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    (tmp_path / "read-only").chmod(0o700)


def seq_len_64_run(out: Path, model: Path, data: Path) -> None:
    """A folder as a 64-token run leaves it: the marker with the run's identity, a complete checkpoint at step 2."""
    from launcher.job import prepare, rundir

    typed = {"model": str(model), "data": str(data), "host_spec": host_path("cpu-only"), "seq_len": 64}
    chosen = settings.layer(typed)
    job = prepare.prepare(build_plan(chosen), chosen, output_dir=out, tokenize=False)
    rundir.claim(out, "train", rundir.CONFIG_NAMES + rundir.RESULT_NAMES)
    rundir.record_run(out, job.identity)
    (out / "checkpoints" / "step2").mkdir(parents=True)
    (out / "checkpoints" / "step2" / rundir.COMPLETE_MARKER).write_text('{"step": 2}')


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_processes(monkeypatch) -> list:
    """Fail loudly if anything launches: launch.run (DeepSpeed's runner), or any process that names
    deepspeed (small helpers such as platform's `uname -p` may still run)."""
    started: list = []
    real_popen = subprocess.Popen

    def refuse(*args, **kwargs):
        started.append(args)
        raise Launched(args)

    def popen(argv, *args, **kwargs):
        if "deepspeed" in str(argv):
            refuse(argv)
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(launch, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


@pytest.fixture
def killed_run_buffer(tmp_path_factory, monkeypatch) -> Path:
    """/dev/shm as a run killed earlier leaves it (one allreduce buffer, its owner gone): a refusal frees nothing
    and says nothing about it, so its error stays the one line (CI once saw the "freed" line before it)."""
    shm = tmp_path_factory.mktemp("shm")
    monkeypatch.setattr(preflight, "SHM_PATH", str(shm))
    left = shm / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29500_0"
    left.write_bytes(b"\1" * 4096)
    return left


def invoke(case: Case):
    args = ["--data", case.data, "--output-dir", "out", *case.args]
    if case.host:
        args += ["--host-spec", case.host if case.host.endswith(".yaml") else host_path(case.host)]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_one_line_before_anything_starts(case, workspace, no_processes, killed_run_buffer, monkeypatch):
    if case.nvme_free_bytes is not None:  # a small drive; DeepSpeed's async_io is asked in a child process
        monkeypatch.setattr(host_module, "disk_free_bytes", lambda _path: case.nvme_free_bytes)
        monkeypatch.setattr(host_module, "aio_usable", lambda: True)
    if case.torch is not None:
        monkeypatch.setattr(planning, "installed_torch_version", lambda: case.torch)
    if case.without_peft:
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real_find_spec(name, *a)
        )
    if case.id == "nvme-not-writable" and os.geteuid() == 0:  # root writes anywhere: a folder it may not
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, m: False if Path(p).name == "read-only" else real_access(p, m))
    before = snapshot(workspace)

    start = time.monotonic()
    result = invoke(case)
    seconds = time.monotonic() - start

    assert not isinstance(result.exception, Launched) and no_processes == [], "a process was started"
    assert result.exit_code == case.exit_code, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # a handled error, not a crash
    assert "Traceback" not in result.output
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1, result.stderr
    line = error_lines[0]
    assert line.startswith("Error: ")
    for part in case.message:
        assert part in line, f"{part!r} not in {line!r}"
    if case.exit_code == 2:
        assert result.stdout == "", result.stdout  # the one line is all there is
    for part in case.stdout:
        assert part in result.stdout, f"{part!r} not in the table:\n{result.stdout}"
    assert snapshot(workspace) == before, "files were written"
    assert not (workspace / "out").exists()
    assert killed_run_buffer.exists(), "a refused run freed /dev/shm"
    assert seconds < case.max_seconds


def test_the_same_command_with_good_input_reaches_the_launch(workspace, no_processes):
    """The control: the harness above would see a launch, and --force takes over another run's folder."""
    result = CliRunner().invoke(
        cli,
        [
            "--model",
            "model",
            "--data",
            "data.jsonl",
            "--output-dir",
            "thesis",
            "--force",
            "--host-spec",
            host_path("cpu-only"),
        ],
    )
    assert isinstance(result.exception, Launched), result.output
    assert len(no_processes) == 1 and "deepspeed.launcher.runner" in no_processes[0][0]
    assert json.loads((workspace / "thesis" / "run_spec.json").read_text())["model"].endswith("model")
    assert (workspace / "thesis" / "chapter1.tex").read_text() == "mine"


def test_smoke_refuses_a_training_runs_folder_and_too_few_steps(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from launcher.cli import cli

    monkeypatch.chdir(tmp_path)
    from launcher.job import rundir

    out = tmp_path / "run"
    rundir.claim(out, "train", ("run_spec.json",))
    (out / "run_spec.json").write_text(json.dumps({"model": "m", "data": "d"}))  # a training run's
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello world"}) + "\n")
    base = ["--model", "meta-llama/Llama-2-7b", "--data", str(data), "--smoke", "--output-dir", str(out)]
    refused = CliRunner().invoke(cli, base)
    assert refused.exit_code == 2 and "holds a training run, which a smoke test would erase" in refused.output
    assert sorted(p.name for p in out.iterdir()) == ["offload-launch.json", "run_spec.json"]
    too_few = CliRunner().invoke(cli, [*base, "--force", "--steps", "1"])
    assert too_few.exit_code == 2 and "--smoke needs --steps of at least 2" in too_few.output
