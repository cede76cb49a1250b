"""Checkpoint bookkeeping on the rank side: which checkpoints count, what a resume discards, what a save
keeps. DeepSpeed's engine and collectives are stood in for by fakes."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from launcher.files import write_json_atomic
from launcher.job.spec import RunSpec
from launcher.rank import checkpoints
from launcher.rank.checkpoints import (
    CHECKPOINT_BYTES_PER_PARAM,
    COMPLETE_MARKER,
    CheckpointStore,
    checkpoint_bytes,
    complete_checkpoints,
    discard_incomplete,
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


# ------------------------------------------------------------------------------------------- store


class FakeEngine:
    """What CheckpointStore uses of a DeepSpeed engine; save_checkpoint writes a file of `size` bytes."""

    def __init__(self, size: int = 64, fail: Exception | None = None):
        import torch

        self.module = torch.nn.Linear(10, 10)  # 110 parameters
        self.device = "cpu"
        self.lr_scheduler = None
        self.size, self.fail, self.loaded = size, fail, []

    def save_checkpoint(self, folder, tag, client_state, exclude_frozen_parameters=False):  # DeepSpeed's signature
        path = checkpoints.Path(folder) / tag
        path.mkdir(parents=True)
        (path / "mp_rank_00_model_states.pt").write_bytes(b"x" * self.size)
        if self.fail:
            raise self.fail
        (path / "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, folder, tag, load_module_strict=True):  # DeepSpeed's signature
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


class RestoringZero3Optimizer:
    """The ZeRO-3 optimizer as a load with the optimizer on NVMe leaves it in a fresh process (stage3.py):
    fp32 partitions with the initial weights, a base optimizer without state or with its learning rate at 0,
    the initial loss scaler. Sub-groups in `swapped` are on NVMe. Records, for each swap-in, the base optimizer's
    state of that sub-group at that moment (what the swapper would register and read from the swap files)."""

    def __init__(self, numels: list[int], group_ids: list[int], swapped: set[int]):
        import collections

        import torch

        self.fp16_groups = [[object()] for _ in numels]
        self.fp16_partitioned_groups_flat_numel = numels
        self.sub_group_to_group_id = dict(enumerate(group_ids))
        self.fp32_partitioned_groups_flat = [torch.zeros(0 if i in swapped else n) for i, n in enumerate(numels)]
        groups = [{"lr": 0.0, "betas": (0.9, 0.999), "params": []} for _ in range(max(group_ids) + 1)]
        self.optimizer = SimpleNamespace(param_groups=groups, state=collections.defaultdict(dict))
        self.loss_scaler, self.dynamic_loss_scale, self.overflow = "initial", True, True
        self.swapped, self.calls, self.seen_at_swap_in = swapped, [], {}

    def _swappable_optimizer_subgroup(self, i):
        return i in self.swapped

    def _optimizer_states_and_gradient_swap_in(self, i, timer_names=None):
        self.calls.append(("swap_in", i))
        state = self.optimizer.state[self.fp32_partitioned_groups_flat[i]]
        self.seen_at_swap_in[i] = {k: v.numel() if hasattr(v, "numel") else v for k, v in state.items()}

    def _reassign_or_swap_out_partitioned_parameters(self, i):
        self.calls.append(("copy_fp32_to_16bit", i))

    def _release_swap_buffers(self, i):
        self.calls.append(("release", i))

    def checkpoint_event_epilogue(self):
        self.calls.append(("gather_persistent",))


def saved_zero_state():
    """A ZeRO-3 optimizer file as DeepSpeed 0.19.8 saves it with the optimizer on NVMe (engine.py,
    _save_zero_checkpoint): sub-groups 0 and 2 in param group 0, sub-group 1 in param group 1, so the base
    optimizer numbers them 0, 1 (group 0) and 2 (group 1). Sub-group 0 swapped by the serial swapper (its state
    tensors saved empty), 1 swapped by the pipelined one (saved as stale swap buffers), 2 in memory."""
    import torch

    return {
        "loss_scaler": "saved",
        "dynamic_loss_scale": False,
        "overflow": False,
        "fp32_flat_groups": [torch.zeros(0), torch.full((3,), -1.0), torch.tensor([1.0, 2.0])],
        "optimizer_state_dict": {
            "param_groups": [
                {"lr": 3e-3, "betas": (0.8, 0.9), "params": [0, 1]},
                {"lr": 1e-3, "betas": (0.8, 0.9), "params": [2]},
            ],
            "state": {
                0: {"step": 3, "exp_avg": torch.zeros(0), "exp_avg_sq": torch.zeros(0)},
                1: {"step": 3, "exp_avg": torch.tensor([0.5, 0.25]), "exp_avg_sq": torch.tensor([0.25, 0.0625])},
                2: {"step": 5, "exp_avg": torch.full((3,), 9.0), "exp_avg_sq": torch.full((3,), 9.0)},
            },
        },
    }


def test_nvme_load_restores_what_deepspeed_leaves_stale_before_each_swap_in(tmp_path):
    import torch

    optimizer = RestoringZero3Optimizer([4, 3, 2], group_ids=[0, 1, 0], swapped={0, 1})
    checkpoints_, _ = store(tmp_path, SimpleNamespace(optimizer=optimizer))
    checkpoints_._refresh_16bit_weights(saved_zero_state())
    # the swapped sub-groups: the step count, and a full-size tensor per state tensor for the swap-in to fill
    # from the restored swap files (the saved copies, empty or stale, are not used)
    assert optimizer.seen_at_swap_in == {
        0: {"step": 3, "exp_avg": 4, "exp_avg_sq": 4},
        1: {"step": 5, "exp_avg": 3, "exp_avg_sq": 3},
    }
    # the sub-group in memory: its fp32 weights and its moments
    in_memory = optimizer.fp32_partitioned_groups_flat[2]
    assert in_memory.tolist() == [1.0, 2.0]
    state = optimizer.optimizer.state[in_memory]
    assert (
        state["step"] == 3
        and state["exp_avg"].tolist() == [0.5, 0.25]
        and state["exp_avg_sq"].tolist() == [0.25, 0.0625]
    )
    assert (optimizer.loss_scaler, optimizer.dynamic_loss_scale, optimizer.overflow) == ("saved", False, False)
    assert optimizer.optimizer.param_groups == [
        {"lr": 3e-3, "betas": (0.8, 0.9), "params": []},  # DeepSpeed fills `params` per sub-group at each step
        {"lr": 1e-3, "betas": (0.8, 0.9), "params": []},
    ]
    # still one swap-in per swapped sub-group, each restored before it is swapped in
    assert optimizer.calls == [
        ("swap_in", 0), ("copy_fp32_to_16bit", 0), ("release", 0),
        ("swap_in", 1), ("copy_fp32_to_16bit", 1), ("release", 1),
        ("copy_fp32_to_16bit", 2),
        ("gather_persistent",),
    ]  # fmt: skip
    assert torch.equal(optimizer.fp32_partitioned_groups_flat[0], torch.zeros(0))  # swapped: from its swap file


def test_nvme_load_after_steps_keeps_the_swappers_own_state_tensors(tmp_path):
    """A process that stepped before the load (the smoke checkpoint check): the swapper already swaps the
    sub-group's state tensors; they are kept (the swap-in fills them from the restored files), the step is set."""
    import torch

    optimizer = RestoringZero3Optimizer([4, 3, 2], group_ids=[0, 1, 0], swapped={0, 1})
    fp32 = optimizer.fp32_partitioned_groups_flat[0]
    registered = {"step": 7, "exp_avg": torch.zeros(0), "exp_avg_sq": torch.zeros(0)}  # released after the step
    optimizer.optimizer.state[fp32] = dict(registered)
    checkpoints_, _ = store(tmp_path, SimpleNamespace(optimizer=optimizer))
    checkpoints_._refresh_16bit_weights(saved_zero_state())
    state = optimizer.optimizer.state[fp32]
    assert state["step"] == 3
    assert state["exp_avg"] is registered["exp_avg"] and state["exp_avg_sq"] is registered["exp_avg_sq"]
