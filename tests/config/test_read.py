"""Reading a user's ds_config (--ds-config and `check`): a key set twice at any depth is an error naming the key
and both lines, as DeepSpeed refuses such a file; binary, non-UTF-8, over-nested and otherwise broken files are
one-line errors, never tracebacks (a fuzz test over random bytes through both readers and both commands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import textfiles
from launcher.cli import cli
from launcher.config.final import MAX_DEPTH, read_user_config
from launcher.errors import UserInputError
from tests.helpers import host_path, save_config, tiny_llama_config

TOP_LEVEL = """{
  "train_micro_batch_size_per_gpu": 1,
  "zero_optimization": {"stage": 2},
  "gradient_accumulation_steps": 1,
  "zero_optimization": {"stage": 3}
}
"""
NESTED = """{
  "train_micro_batch_size_per_gpu": 1,
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {
      "device": "cpu",
      "device": "none"
    }
  }
}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_config(tiny_llama_config(), tmp_path_factory.mktemp("model") / "tiny-llama"))


def write(folder: Path, data: str | bytes, name: str = "ds.json") -> str:
    path = folder / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def check(path: str, tiny: str, *extra: str):
    return CliRunner().invoke(cli, ["check", path, "--model", tiny, "--host-spec", host_path("cpu-only"), *extra])


def dry_run(path: str, tiny: str):
    return CliRunner().invoke(
        cli, ["--model", tiny, "--host-spec", host_path("cpu-only"), "--ds-config", path, "--dry-run"]
    )


def one_line_error(result) -> str:
    """The single 'Error: ...' line of a refused command (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


# ------------------------------------------------------------------------------------------ duplicate keys


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        (TOP_LEVEL, "zero_optimization", "lines 3 and 5"),
        (NESTED, "zero_optimization.offload_optimizer.device", "lines 6 and 7"),
    ],
)
def test_check_reports_a_duplicate_key_with_its_path_and_both_lines(tmp_path, tiny, text, key, lines):
    result = check(write(tmp_path, text), tiny)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"error: {key}: duplicate key ({lines}); DeepSpeed refuses" in result.output
    report = json.loads(check(write(tmp_path, text), tiny, "--json").stdout)
    assert report["errors"] >= 1 and report["findings"][0]["path"] == key


@pytest.mark.parametrize(
    ("text", "key", "line", "lines"),
    [
        (TOP_LEVEL, "zero_optimization", 5, "lines 3 and 5"),
        (NESTED, "zero_optimization.offload_optimizer.device", 7, "lines 6 and 7"),
    ],
)
def test_ds_config_with_a_duplicate_key_is_refused_in_one_line(tmp_path, tiny, text, key, line, lines):
    path = write(tmp_path, text)
    message = one_line_error(dry_run(path, tiny))
    assert message.startswith(f"Error: {path}:{line}: duplicate key '{key}' ({lines}); DeepSpeed refuses"), message


def test_every_duplicate_is_found_once_on_its_lines():
    text = '{"a": [{"x": 1}, {}, {"x": 1, "y": 2,\n"x": 3}],\n "b": {"c": {"d": 1, "d": 2}}, "a": 0, "a": 1}'
    found = textfiles.parse_json(text, "f.json", max_depth=MAX_DEPTH).duplicates
    assert [(d.path, d.lines) for d in found] == [("a[2].x", (1, 2)), ("b.c.d", (3, 3)), ("a", (1, 3)), ("a", (1, 3))]
    assert str(found[1]) == "duplicate key 'b.c.d' (twice on line 3)"
    assert textfiles.parse_json('{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}', "f", max_depth=9).duplicates == ()


# ------------------------------------------------------------------------------------------ broken files


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x01\xff\xfe binary", "not UTF-8 text (byte 2)"),
        ('{"zero_optimization": {"stage": "\u00e9"}}'.encode("latin-1"), "not UTF-8 text"),
        ("[" * 5000 + "]" * 5000, f"nested deeper than {MAX_DEPTH} levels"),
        ('{"a":' * 500 + "1" + "}" * 500, f":1: nested deeper than {MAX_DEPTH} levels"),
        (
            '{\n"zero_optimization": {"offload_param": \n' + "[" * 40 + "]" * 40 + "}}",
            f":3: nested deeper than {MAX_DEPTH}",
        ),
        (
            '{"train_batch_size": 1,\n "\\ud800": 1}',
            ":2: invalid JSON: a \\uD800-\\uDFFF escape without its other half",
        ),
        ('{"a": [1, "x\\udc00"]}', ":1: invalid JSON: a \\uD800-\\uDFFF escape"),
    ],
)
def test_broken_files_are_one_line_errors_for_check_and_ds_config(tmp_path, tiny, data, message):
    path = write(tmp_path, data)
    with pytest.raises(UserInputError, match="^[^\n]*$") as err:
        read_user_config(path)
    assert message in str(err.value)
    assert message in one_line_error(check(path, tiny))
    assert message in one_line_error(dry_run(path, tiny))


def test_half_a_surrogate_pair_is_refused_and_a_whole_one_is_a_character(tmp_path):
    with pytest.raises(UserInputError, match=r"x\.json:3: invalid JSON: a \\uD800-\\uDFFF escape"):
        read_user_config(write(tmp_path, '{"wandb":\n {"project": "ok",\n  "team": "\\udc00\\ud83d"}}', "x.json"))
    path = write(tmp_path, '{"wandb": {"project": "\\ud83d\\ude00 \\\\ud800 caf\u00e9"}}')  # a pair, a backslash
    assert read_user_config(path).config == {"wandb": {"project": "\U0001f600 \\ud800 caf\u00e9"}}


# ------------------------------------------------------------------------------------------ fuzz

PIECES = [b"{", b"}", b"[", b"]", b":", b",", b" ", b"\n", b"1", b"1e999", b"null", b"NaN", b'"a"', b'"stage"']
PIECES += [b'"zero_optimization"', b'"\\ud800"', b'"\\ud83d\\ude00"', b'"\\\\"', b"\xff", b"\x00", b"\xef\xbb\xbf"]
KEYS = st.sampled_from(["zero_optimization", "stage", "train_micro_batch_size_per_gpu", "a", "\u00e9", "\ud800"])


def _objects(children):
    return st.lists(st.tuples(KEYS, children), max_size=4)  # pairs, so a key can repeat


def _dump(node) -> str:
    if isinstance(node, list) and node and isinstance(node[0], tuple):
        return "{" + ",\n".join(f"{json.dumps(k)}: {_dump(v)}" for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(v) for v in node) + "]"
    return json.dumps(node)


JSONISH = st.recursive(
    st.integers() | st.floats() | st.text(max_size=4) | st.booleans() | st.none(),
    lambda children: st.lists(children, max_size=3) | _objects(children),
    max_leaves=12,
).map(lambda node: _dump(node).encode("utf-8", "surrogatepass"))
RANDOM_BYTES = st.one_of(
    st.binary(max_size=80),
    st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join),
    JSONISH,
    st.tuples(JSONISH, st.binary(max_size=3), st.integers(0, 200)).map(lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]),
    st.integers(1, 1200).map(lambda n: b'{"zero_optimization": ' * n + b"1" + b"}" * n),
)


@settings(max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=RANDOM_BYTES)
def test_random_bytes_as_a_ds_config_are_read_or_refused_in_one_line(tmp_path_factory, tiny, data):
    path = write(tmp_path_factory.mktemp("fuzz"), data)
    try:
        read_user_config(path)
    except UserInputError as err:
        assert "\n" not in str(err)
    for result in (check(path, tiny), dry_run(path, tiny)):
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 2, 3) and "Traceback" not in result.output, result.output
        if result.exit_code:
            assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output
