"""The one training step the loop and the smoke checks share, on a stand-in engine: micro-batches, the
averaged loss, and where the kill-point drill fires."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from launcher.data.sampling import BlockOrder
from launcher.rank import checkpoints
from launcher.rank.checkpoints import KILL_AT_ENV
from launcher.rank.trainer import Trainer, has_weights


class FakeEngine:
    """Loss = the first token id of the batch; records forward/backward/step calls in order."""

    device = "cpu"

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, input_ids, labels):
        self.calls.append(f"forward {int(input_ids[0, 0])}")
        return SimpleNamespace(loss=input_ids[0, 0].float())

    def backward(self, loss):
        self.calls.append("backward")

    def step(self):
        self.calls.append("step")


def trainer(grad_accum=2, world=2, rank=0, blocks=None) -> Trainer:
    """A Trainer without DeepSpeed: only what train_step and batches read."""
    t = Trainer.__new__(Trainer)
    t.torch, t.engine, t.rank, t.world, t.grad_accum, t.micro_batch = torch, FakeEngine(), rank, world, grad_accum, 1
    # all_reduce sums over ranks: every rank here had the same loss
    t.dist = SimpleNamespace(all_reduce=lambda tensor: tensor.mul_(world))
    t.blocks = blocks if blocks is not None else np.arange(40).reshape(20, 2)
    return t


def test_train_step_runs_every_micro_batch_and_averages_over_micro_batches_and_ranks():
    t = trainer(grad_accum=3, world=2)
    loss = t.train_step(lambda micro: torch.tensor([[10 * (micro + 1)]]), step=1)
    assert loss == pytest.approx((10 + 20 + 30) / 3)
    assert t.engine.calls == [call for n in (10, 20, 30) for call in (f"forward {n}", "backward", "step")]


def test_the_kill_point_fires_after_the_first_backward_of_the_named_step(monkeypatch):
    t = trainer(grad_accum=2)

    def kill(pid, sig):
        assert sig == signal.SIGKILL
        raise SystemExit("killed")

    monkeypatch.setattr(checkpoints.os, "kill", kill)
    monkeypatch.setenv(KILL_AT_ENV, "step:2")
    t.train_step(lambda micro: torch.tensor([[1]]), step=1)
    t.train_step(lambda micro: torch.tensor([[1]]))  # an extra step (the smoke checkpoint check's) has no number
    t.engine.calls.clear()
    with pytest.raises(SystemExit, match="killed"):
        t.train_step(lambda micro: torch.tensor([[1]]), step=2)
    assert t.engine.calls == ["forward 1", "backward"]  # killed before the optimizer step


def test_batches_follow_the_block_order_across_steps():
    t = trainer(grad_accum=2, world=1)
    order = BlockOrder(len(t.blocks), 1, 0, seed=3)
    got = [t.batches(order, step)(micro) for step in (1, 2) for micro in (0, 1)]
    expected = [torch.from_numpy(t.blocks[order.batch(i, 1)]) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_first_batch_is_the_first_micro_batch_of_step_1():
    t = trainer(grad_accum=2, world=1)
    t.spec = SimpleNamespace(seed=3)
    order = BlockOrder(len(t.blocks), 1, 0, seed=3)
    assert torch.equal(t.first_batch(), t.batches(order, 1)(0))


def test_planned_placement_reads_the_ds_config():
    t = trainer()
    t.zero = {"stage": 3, "offload_optimizer": {"device": "nvme"}}
    assert t.planned_placement() == (3, "nvme", "none")
    t.zero = {}
    assert t.planned_placement() == (0, "none", "none")


def test_has_weights(tmp_path):
    assert has_weights("org/some-model")  # a hub id: from_pretrained fetches them
    assert not has_weights(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert has_weights(str(tmp_path))
