"""Binary, undecodable or corrupt --data through the real CLI: exit 2 and one line on stderr, never a traceback,
for every data format; and bad bytes deep in a file (past what the dry run reads) stop a real run the same way
while its data is tokenized, before anything is launched."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.job import launch
from tests.data.corpus import DOCS, write_arrow, write_jsonl
from tests.helpers import REPO, host_path, offload_launch, save_config, tiny_llama_config

DEMO_MODEL = REPO / "launcher" / "demo" / "tiny-llama"
GARBAGE = random.Random(20000).randbytes(20000)  # `head -c 20000 /dev/urandom`, the same bytes every run


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A tiny Llama config with the demo's tokenizer (891 tokens), in the working folder."""
    directory = save_config(tiny_llama_config(vocab_size=891), tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / name, directory / name)
    return directory


def garbage_saved_dataset(folder: Path) -> str:
    saved = write_arrow(folder, {"text": DOCS})
    (saved / "dataset_info.json").write_bytes(GARBAGE)
    return saved.name


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("garbage.jsonl", "garbage.jsonl:1: byte 0x"),
        ("garbage.json", "garbage.json:1: byte 0x"),
        ("garbage.txt", "garbage.txt:1: byte 0x"),
        ("garbage.csv", "garbage.csv:1: byte 0x"),
        ("garbage.parquet", "garbage.parquet: not a readable parquet file (ArrowInvalid: Parquet magic bytes"),
        ("saved", "saved/dataset_info.json:1: byte 0x"),
    ],
)
def test_random_bytes_as_data_are_one_line_and_exit_2(data, message, model, tmp_path):
    if data == "saved":
        garbage_saved_dataset(tmp_path)
    else:
        (tmp_path / data).write_bytes(GARBAGE)
    result = offload_launch("--model", "model", "--data", data, "--dry-run", "--host-spec", "cpu-only", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {message}"), lines[0]
    if data != "garbage.parquet":
        assert "is not UTF-8 text (the file looks binary or is in another encoding); convert it to UTF-8" in lines[0]


class Launched(Exception):
    """Raised by the stand-in for launch.run: reaching it means a DeepSpeed process would have started."""


def test_bad_bytes_deep_in_the_data_stop_a_real_run_before_the_launch(model, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise Launched(args)

    monkeypatch.setattr(launch, "run", refuse)
    monkeypatch.chdir(tmp_path)
    good = write_jsonl(tmp_path, {"text": DOCS * 1000}).read_bytes()  # 3000 records: the dry run reads 100
    (tmp_path / "deep.jsonl").write_bytes(good + b'{"text": "caf\xe9"}\n')
    args = ["--model", "model", "--output-dir", "out", "--host-spec", host_path("cpu-only")]

    dry = CliRunner().invoke(cli, [*args, "--data", "deep.jsonl", "--dry-run"])
    assert dry.exit_code == 0, dry.output  # the dry run checks the first records only
    result = CliRunner().invoke(cli, [*args, "--data", "deep.jsonl"])
    assert not isinstance(result.exception, Launched), "the launch was reached"
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        "Error: deep.jsonl:3001: byte 0xe9 is not UTF-8 text (the file looks binary or is in another encoding); "
        "convert it to UTF-8 (iconv -t UTF-8) or pass the right file"
    ]
