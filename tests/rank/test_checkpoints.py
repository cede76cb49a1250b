"""Checkpoint bookkeeping on the rank side: which checkpoints count, what a resume discards, what a save
keeps, and the kill-point drill. DeepSpeed's engine and collectives are stood in for by fakes."""

from __future__ import annotations

import json
import shutil
import signal
from types import SimpleNamespace

import pytest

from launcher.files import write_json_atomic
from launcher.job.spec import RunSpec
from launcher.rank import checkpoints
from launcher.rank.checkpoints import (
    CHECKPOINT_BYTES_PER_PARAM,
    COMPLETE_MARKER,
    KILL_AT_ENV,
    CheckpointStore,
    checkpoint_bytes,
    complete_checkpoints,
    discard_incomplete,
    kill_point,
    mark_complete,
    previous_checkpoint,
    trim_metrics,
)


def make_checkpoint(root, step: int, complete: bool = True, size: int = 10):
    folder = root / f"step{step}"
    folder.mkdir(parents=True)
    (folder / "model_states.pt").write_bytes(b"x" * size)
    if complete:
        write_json_atomic(folder / COMPLETE_MARKER, {"step": step})
    return folder


# ------------------------------------------------------------------------------------------- discovery


def test_complete_checkpoints_sort_by_step_number_not_name(tmp_path):
    for step in (10, 9, 100):
        make_checkpoint(tmp_path, step)
    assert complete_checkpoints(tmp_path) == [(9, "step9"), (10, "step10"), (100, "step100")]


def test_complete_checkpoints_skip_unmarked_torn_and_stepless_markers(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4, complete=False)
    (make_checkpoint(tmp_path, 6, complete=False) / COMPLETE_MARKER).write_text('{"step": 6')  # torn write
    (make_checkpoint(tmp_path, 8, complete=False) / COMPLETE_MARKER).write_text('{"time": 1}')  # no step
    assert complete_checkpoints(tmp_path) == [(2, "step2")]
    assert complete_checkpoints(tmp_path / "missing") == []


def test_discard_incomplete_removes_only_unmarked_folders(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4, complete=False)
    make_checkpoint(tmp_path, 3, complete=False)
    (tmp_path / "latest").write_text("step4")  # DeepSpeed's tag file: not a folder, left alone
    assert discard_incomplete(tmp_path) == ["step3", "step4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step2"]
    assert (tmp_path / "step2" / "model_states.pt").exists()
    assert discard_incomplete(tmp_path / "missing") == []


def test_mark_complete_keeps_the_newest_and_never_touches_an_incomplete_one(tmp_path):
    for step in (2, 4):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 5, complete=False)  # another writer's folder: not ours to prune
    make_checkpoint(tmp_path, 6, complete=False)
    assert mark_complete(tmp_path, "step6", 6, keep=2) == ["step2"]
    assert json.loads((tmp_path / "step6" / COMPLETE_MARKER).read_text())["step"] == 6
    assert complete_checkpoints(tmp_path) == [(4, "step4"), (6, "step6")]
    assert (tmp_path / "step5").exists()
    make_checkpoint(tmp_path, 8, complete=False)
    assert mark_complete(tmp_path, "step8", 8, keep=1) == ["step4", "step6"]
    assert complete_checkpoints(tmp_path) == [(8, "step8")]


def test_previous_checkpoint_names_the_newest_complete_one(tmp_path):
    assert previous_checkpoint(tmp_path) == "there is no earlier checkpoint"
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 12)
    make_checkpoint(tmp_path, 14, complete=False)
    assert previous_checkpoint(tmp_path) == "checkpoint step12 is intact"


def test_checkpoint_bytes_estimate_then_the_newest_size(tmp_path):
    assert CHECKPOINT_BYTES_PER_PARAM == 14
    assert checkpoint_bytes(tmp_path, 1000) == 14_000
    make_checkpoint(tmp_path, 2, size=100)
    make_checkpoint(tmp_path, 4, size=300)
    make_checkpoint(tmp_path, 6, complete=False, size=5000)
    marker = len((tmp_path / "step4" / COMPLETE_MARKER).read_bytes())
    assert checkpoint_bytes(tmp_path, 1000) == 300 + marker  # the newest complete one, marker included


# ------------------------------------------------------------------------------------------- metrics


def test_trim_metrics_keeps_steps_up_to_the_checkpoint_and_drops_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3, 4, 5)]
    path.write_text("\n".join([*lines[:2], "not json", '{"loss": 1}', *lines[2:], '{"step": 6, "lo']) + "\n")
    trim_metrics(path, 3)
    assert path.read_text() == "".join(line + "\n" for line in lines[:3])
    trim_metrics(path, 0)  # a fresh start keeps nothing
    assert path.read_text() == ""
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_trim_metrics_without_a_file_writes_none(tmp_path):
    trim_metrics(tmp_path / "metrics.jsonl", 3)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------- drill


def test_kill_point_kills_rank_0_only_at_the_named_point(monkeypatch):
    kills = []
    monkeypatch.setattr(checkpoints.os, "kill", lambda pid, sig: kills.append(sig))
    monkeypatch.setenv(KILL_AT_ENV, "checkpoint:4")
    kill_point("step", 4, rank=0)
    kill_point("checkpoint", 2, rank=0)
    kill_point("checkpoint", 4, rank=1)
    assert kills == []
    kill_point("checkpoint", 4, rank=0)
    assert kills == [signal.SIGKILL]
    monkeypatch.delenv(KILL_AT_ENV)
    kill_point("checkpoint", 4, rank=0)
    assert kills == [signal.SIGKILL]


# ------------------------------------------------------------------------------------------- store


class FakeEngine:
    """What CheckpointStore uses of a DeepSpeed engine; save_checkpoint writes a file of `size` bytes."""

    def __init__(self, size: int = 64, fail: Exception | None = None):
        import torch

        self.module = torch.nn.Linear(10, 10)  # 110 parameters
        self.device = "cpu"
        self.lr_scheduler = None
        self.size, self.fail, self.loaded = size, fail, []

    def save_checkpoint(self, folder, tag, client_state):
        path = checkpoints.Path(folder) / tag
        path.mkdir(parents=True)
        (path / "mp_rank_00_model_states.pt").write_bytes(b"x" * self.size)
        if self.fail:
            raise self.fail
        (path / "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, folder, tag):
        self.loaded.append(tag)
        state = json.loads((checkpoints.Path(folder) / tag / "client.json").read_text())
        return str(checkpoints.Path(folder) / tag), state


FAKE_DIST = SimpleNamespace(barrier=lambda: None, all_reduce=lambda *a, **k: None, ReduceOp=SimpleNamespace(MIN=0))


def store(tmp_path, engine, **spec_fields):
    spec = RunSpec(output_dir=str(tmp_path), model="m", data="d", seq_len=8, steps=10, **spec_fields)
    logged: list[str] = []
    result = CheckpointStore(engine, spec, 0, {"stage": 2}, logged.append)
    result.dist = FAKE_DIST  # one rank: the collectives have nothing to do
    return result, logged


def test_save_marks_complete_and_keeps_the_newest(tmp_path):
    checkpoints_, _ = store(tmp_path, FakeEngine(), keep_checkpoints=2)
    for step in (2, 4, 6):
        checkpoints_.save(step)
    assert complete_checkpoints(tmp_path / "checkpoints") == [(4, "step4"), (6, "step6")]
    assert checkpoints_.skipped == []


def test_save_without_room_is_skipped_with_a_warning(tmp_path, monkeypatch):
    checkpoints_, logged = store(tmp_path, FakeEngine())
    checkpoints_.save(2)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: usage._replace(free=10))
    checkpoints_.save(4)
    assert checkpoints_.skipped == [4]
    assert not (tmp_path / "checkpoints" / "step4").exists()
    assert "warning: checkpoint step4 skipped" in logged[-1] and "checkpoint step2 is intact" in logged[-1]


def test_a_failed_write_removes_the_partial_folder_and_stops(tmp_path):
    engine = FakeEngine()
    checkpoints_, _ = store(tmp_path, engine)
    checkpoints_.save(2)
    engine.fail = OSError("No space\nleft on device")
    with pytest.raises(SystemExit, match="checkpoint step4 failed while writing.*No space left on device") as exc:
        checkpoints_.save(4)
    assert "checkpoint step2 is intact" in str(exc.value) and "rerun the same command to resume" in str(exc.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step2"]


def test_resume_discards_the_incomplete_and_loads_the_newest_complete(tmp_path):
    engine = FakeEngine()
    checkpoints_, logged = store(tmp_path, engine)
    assert checkpoints_.resume() == 0  # nothing saved yet: a fresh start
    checkpoints_.save(2)
    checkpoints_.save(4)
    (tmp_path / "checkpoints" / "step4" / COMPLETE_MARKER).unlink()  # as if killed before the marker
    assert checkpoints_.resume() == 2
    assert engine.loaded == ["step2"]
    assert logged == [
        "removed incomplete checkpoint step4 (the run stopped while writing it)",
        "resumed from step2 (step 2)",
    ]
    assert not (tmp_path / "checkpoints" / "step4").exists()


def test_no_resume_starts_fresh_and_keeps_everything(tmp_path):
    engine = FakeEngine()
    checkpoints_, _ = store(tmp_path, engine, resume=False)
    checkpoints_.save(2)
    make_checkpoint(tmp_path / "checkpoints", 3, complete=False)
    assert checkpoints_.resume() == 0
    assert engine.loaded == [] and (tmp_path / "checkpoints" / "step3").exists()


class SwappedZero3Optimizer:
    """The ZeRO-3 optimizer's sub-group interface (deepspeed/runtime/zero/stage3.py) with every sub-group's fp32
    partition on NVMe: records the calls, and fails a refresh that reads a sub-group it has not swapped in."""

    def __init__(self, params_per_group: list[int]):
        self.fp16_groups = [[object()] * n for n in params_per_group]
        self.calls: list[tuple] = []
        self.swapped_in: set[int] = set()

    def _swappable_optimizer_subgroup(self, i):
        return True

    def _optimizer_states_and_gradient_swap_in(self, i, timer_names=None):
        self.calls.append(("swap_in", i))
        self.swapped_in.add(i)

    def _reassign_or_swap_out_partitioned_parameters(self, i):
        assert i in self.swapped_in, f"sub-group {i} read while on NVMe"
        self.calls.append(("copy_fp32_to_16bit", i))

    def _release_swap_buffers(self, i):
        self.calls.append(("release", i))
        self.swapped_in.discard(i)

    def checkpoint_event_epilogue(self):
        self.calls.append(("gather_persistent",))


def test_refresh_after_an_nvme_load_swaps_each_sub_group_in_once(tmp_path):
    """Not once per parameter (safe_get_full_fp32_param swaps the parameter's whole sub-group in)."""
    optimizer = SwappedZero3Optimizer([3, 5, 1])  # 9 parameters in 3 sub-groups
    checkpoints_, _ = store(tmp_path, SimpleNamespace(optimizer=optimizer))
    checkpoints_._refresh_16bit_weights()
    expected = [(step, i) for i in range(3) for step in ("swap_in", "copy_fp32_to_16bit", "release")]
    assert optimizer.calls == [*expected, ("gather_persistent",)]
    assert sum(call[0] == "swap_in" for call in optimizer.calls) == 3
