"""The one training step the loop and the smoke checks share, on a stand-in engine: micro-batches, the
averaged loss, where the kill-point drill fires, and the GPU memory each step measures and gathers (the
gathering over a real gloo process group; the CUDA and NVML readings through stand-ins)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from launcher.data.rows import TokenSet
from launcher.data.sampling import BlockOrder
from launcher.drills import KILL_AT_ENV
from launcher.inspection.cuda_devices import nvml_process_bytes
from launcher.rank import checkpoints
from launcher.rank.gpu_memory import GpuMemory, max_over_ranks
from launcher.rank.loading import has_weights
from launcher.rank.progress import GpuPeaks, gpu_step_figures
from launcher.rank.trainer import Trainer, on_cuda


class FakeEngine:
    """Loss = the first token id of the batch; records forward/backward/step calls in order."""

    device = "cpu"

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, input_ids, labels, **_):
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
    t.rows = TokenSet({"input_ids": blocks if blocks is not None else np.arange(40).reshape(20, 2)})
    t.gpu_memory, t.gpu_peaks, t.gpu_step = None, GpuPeaks(), None  # the CPU accelerator
    t.spec = SimpleNamespace(offload_activations=False, model_kind="causal-lm")
    return t


def one(token: int) -> dict:
    """A micro-batch of one single-token row, as Trainer.inputs makes them."""
    return {"input_ids": torch.tensor([[token]]), "labels": torch.tensor([[token]])}


def test_offloaded_activations_are_saved_through_save_on_cpu():
    """With the plan's act->cpu the forward runs under torch's save_on_cpu hooks (host_buffers.py [act-offload]), so the
    tensors autograd saves are packed off the device; without it, under none."""
    seen = []

    class Engine(FakeEngine):
        def __call__(self, input_ids, labels, **_):
            seen.append(torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
            return super().__call__(input_ids, labels)

    for offload in (True, False):
        t = trainer(grad_accum=1, world=1)
        t.engine, t.spec = Engine(), SimpleNamespace(offload_activations=offload, model_kind="causal-lm")
        t.train_step(lambda micro: one(7))
    assert seen == [True, False]


def test_train_step_runs_every_micro_batch_and_averages_over_micro_batches_and_ranks():
    t = trainer(grad_accum=3, world=2)
    loss = t.train_step(lambda micro: one(10 * (micro + 1)), step=1)
    assert loss == pytest.approx((10 + 20 + 30) / 3)
    assert t.engine.calls == [call for n in (10, 20, 30) for call in (f"forward {n}", "backward", "step")]


def test_the_kill_point_fires_after_the_first_backward_of_the_named_step(monkeypatch):
    t = trainer(grad_accum=2)

    def kill(pid, sig):
        assert sig == signal.SIGKILL
        raise SystemExit("killed")

    monkeypatch.setattr(checkpoints.os, "kill", kill)
    monkeypatch.setenv(KILL_AT_ENV, "step:2")
    t.train_step(lambda micro: one(1), step=1)
    t.train_step(lambda micro: one(1))  # an extra step (the smoke checkpoint check's) has no number
    t.engine.calls.clear()
    with pytest.raises(SystemExit, match="killed"):
        t.train_step(lambda micro: one(1), step=2)
    assert t.engine.calls == ["forward 1", "backward"]  # killed before the optimizer step


def test_batches_follow_the_block_order_across_steps():
    t = trainer(grad_accum=2, world=1)
    blocks = t.rows.arrays["input_ids"]
    order = BlockOrder(len(blocks), 1, 0, seed=3)
    got = [t.batches(order, step)(micro) for step in (1, 2) for micro in (0, 1)]
    expected = [torch.from_numpy(blocks[order.batch(i, 1)]) for i in range(4)]
    assert all(
        torch.equal(a["input_ids"], b) and torch.equal(a["labels"], b) for a, b in zip(got, expected, strict=True)
    )
    assert got[0]["labels"].data_ptr() != got[0]["input_ids"].data_ptr()  # evaluate() may ignore a row's labels


def test_first_batch_is_the_first_micro_batch_of_step_1():
    t = trainer(grad_accum=2, world=1)
    t.spec = SimpleNamespace(seed=3)
    order = BlockOrder(len(t.rows), 1, 0, seed=3)
    first, again = t.first_batch(), t.batches(order, 1)(0)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)


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


# ------------------------------------------------------------------------------------------- GPU memory

GIB = 2**30


def test_the_cpu_accelerator_measures_no_gpu_memory():
    t = trainer(grad_accum=1, world=1)
    t.train_step(lambda micro: one(1), step=1)
    assert t.gpu_step is None and t.gpu_bytes_per_device() is None and t.gpu_peaks.measured() is None
    assert not on_cuda(torch, "cpu") and not on_cuda(torch, torch.device("cpu"))
    assert on_cuda(torch, torch.device("cuda", 1)) and on_cuda(torch, "cuda:0")


def spawn(tmp_path, function, world=2):
    """Run `function(rank, world, init_file, tmp_path)` in `world` processes joined by a gloo group."""
    import torch.multiprocessing as mp

    mp.spawn(function, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]


def join_gloo(rank, world, store):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    return dist


class FakeGpuMemory:
    """One rank's readings: its own figures, as GpuMemory.end_step returns them."""

    def __init__(self, figures: dict, source: str):
        self.figures, self.source, self.started = figures, source, 0

    def start_step(self):
        self.started += 1

    def end_step(self):
        return self.figures, self.source


RANK_FIGURES = [
    # rank 0 reserved more at its peak, rank 1 holds more outside the allocator and read total - free
    (gpu_step_figures(20 * GIB, 18 * GIB, 21 * GIB, 20 * GIB), "nvml-process"),
    (gpu_step_figures(19 * GIB, 18 * GIB + 5, 22 * GIB, 19 * GIB), "device-used"),
]


def train_step_worker(rank, world, store, folder):
    import torch.distributed as dist

    join_gloo(rank, world, store)
    gathered = max_over_ranks(dist, [float(10 * rank + 1), float(2**50 - rank), float(5 - rank)], "cpu")
    t = trainer(grad_accum=2, world=world, rank=rank)
    t.dist = dist  # the real all-reduces: the loss's sum and the GPU figures' MAX
    t.gpu_memory = FakeGpuMemory(*RANK_FIGURES[rank])
    loss = t.train_step(lambda micro: one(10 * (rank + 1)), step=1)
    result = {"loss": loss, "step": t.gpu_step, "run": t.gpu_peaks.measured(), "started": t.gpu_memory.started}
    result["gpu_bytes_per_device"], result["gathered"] = t.gpu_bytes_per_device(), gathered
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_every_rank_measures_its_step_and_all_get_the_largest_over_a_real_gloo_group(tmp_path):
    results = spawn(tmp_path, train_step_worker)  # one group for both checks: each spawn imports torch again
    assert results[0] == results[1]  # every rank has the same figures for metrics.jsonl and run.json
    got = results[0]
    assert got["gathered"] == [11.0, 2.0**50, 5.0]  # max_over_ranks: each value's largest, exact in float64
    assert got["loss"] == pytest.approx(15.0) and got["started"] == 1
    assert got["step"] == {
        "gpu_bytes_per_device": 22 * GIB,  # rank 1: 19 GiB reserved + 3 GiB outside the allocator
        "gpu_reserved_bytes_per_device": 20 * GIB,  # rank 0
        "gpu_allocated_bytes_per_device": 18 * GIB + 5,  # rank 1
    }
    assert got["run"] == {**got["step"], "gpu_memory_source": "device-used"}
    assert got["gpu_bytes_per_device"] == 22 * GIB


class FakeCuda:
    """torch.cuda as GpuMemory reads it: peaks since the last reset, the current reservation, total/free."""

    def __init__(self):
        self.calls: list[str] = []
        self.peak_reserved, self.peak_allocated, self.reserved = 12 * GIB, 10 * GIB, 11 * GIB
        self.free, self.total = 60 * GIB, 80 * GIB

    def reset_peak_memory_stats(self, device):
        self.calls.append(f"reset {device}")

    def synchronize(self, device):
        self.calls.append("synchronize")

    def memory_reserved(self, device):
        return self.reserved

    def max_memory_reserved(self, device):
        return self.peak_reserved

    def max_memory_allocated(self, device):
        return self.peak_allocated

    def mem_get_info(self, device):
        return self.free, self.total


class FakeNvml:
    def __init__(self, processes):
        self.processes = processes

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802 - pynvml's name
        if isinstance(self.processes, Exception):
            raise self.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes]


def gpu_memory(processes) -> tuple[GpuMemory, FakeCuda]:
    cuda = FakeCuda()
    fake_torch = SimpleNamespace(cuda=cuda, device=torch.device)
    nvml = (FakeNvml(processes), "handle") if processes is not None else (None, None)
    return GpuMemory(fake_torch, torch.device("cuda", 1), nvml=nvml), cuda


def test_gpu_memory_resets_the_peak_each_step_and_adds_what_nvml_says_lies_outside_the_allocator():
    memory, cuda = gpu_memory([(os.getpid() + 1, 3 * GIB), (os.getpid(), 12 * GIB + GIB // 2)])
    memory.start_step()
    figures, source = memory.end_step()
    assert cuda.calls == ["reset cuda:1", "synchronize"]
    # this process holds 12.5 GiB, the allocator 11 GiB of it: 1.5 GiB outside, on top of the 12 GiB peak
    assert source == "nvml-process"
    assert figures == {
        "gpu_bytes_per_device": 13 * GIB + GIB // 2,
        "gpu_reserved_bytes_per_device": 12 * GIB,
        "gpu_allocated_bytes_per_device": 10 * GIB,
    }


def test_gpu_memory_falls_back_to_the_devices_total_minus_free():
    # another process's 3 GiB is on the device and NVML cannot say which process is this one
    memory, _ = gpu_memory([(1, 3 * GIB), (2, 12 * GIB)])
    figures, source = memory.end_step()
    assert source == "device-used"
    assert figures["gpu_bytes_per_device"] == 12 * GIB + (20 * GIB - 11 * GIB)  # 80 - 60 used, 11 reserved
    for processes in (None, [], RuntimeError("NVML"), [(os.getpid(), None)], [(os.getpid(), 2**64 - 1)]):
        assert gpu_memory(processes)[0].end_step()[1] == "device-used", processes


def test_nvml_process_bytes():
    pid = 1234
    assert nvml_process_bytes(FakeNvml([(pid, 5), (99, 7)]), "h", pid) == 5
    # a container's pid namespace: NVML reports the host pid; the only process on our device is this one
    assert nvml_process_bytes(FakeNvml([(4321, 5)]), "h", pid) == 5
    assert nvml_process_bytes(FakeNvml([(4321, 5), (99, 7)]), "h", pid) is None
    assert nvml_process_bytes(FakeNvml([]), "h", pid) is None
    assert nvml_process_bytes(None, None, pid) is None


def test_the_module_trains_in_the_dtype_the_config_enables():
    """rank/loading.training_dtype: bf16 (or its old name), fp16, else DeepSpeed's default fp32 - never fp16 for a
    config that enables neither."""
    import torch

    from launcher.rank.loading import training_dtype

    assert training_dtype({"bf16": {"enabled": True}}) is torch.bfloat16
    assert training_dtype({"bfloat16": {"enabled": True}}) is torch.bfloat16
    assert training_dtype({"fp16": {"enabled": True}}) is torch.float16
    assert training_dtype({}) is torch.float32 and training_dtype({"bf16": {"enabled": False}}) is torch.float32
