"""The trainer: one rank's engine, model, tokenizer and data, and the training loop.

`Trainer.train_step` is the one optimizer step, used by the loop (`fit`) and by the smoke checks
(launcher/rank/smoke_checks.py). Checkpoint I/O lives in checkpoints.py, the export in export.py, the metrics,
the progress bar and run.json in progress.py; launcher/rank/main.py starts it all.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from launcher.data.sampling import BlockOrder
from launcher.drills import kill_point
from launcher.files import folder_bytes, write_json_atomic
from launcher.inspection.model import AUTO_CLASSES
from launcher.job.rundir import METRICS_FILE, SWAP_OWNER_FILE
from launcher.job.spec import RunSpec, node_rank
from launcher.rank import adapter
from launcher.rank.checkpoints import CheckpointStore, trim_metrics
from launcher.rank.export import FINAL_DIR, MERGED_DIR, drop_optimizer_state, export_final
from launcher.rank.gpu_memory import GpuMemory, max_over_ranks
from launcher.rank.loading import load_model
from launcher.rank.progress import (
    GpuPeaks,
    Metrics,
    PhaseClock,
    Progress,
    gpu_figures_from_vector,
    gpu_figures_vector,
    measured_figures,
    node_count,
    peak_rss_bytes,
    run_summary,
    step_record,
)

EVAL_MAX_ROWS = 512  # held-out rows an eval loss reads at most (the first of them: the same ones every time)


class Trainer:
    """One rank's view of the run. Construction loads everything; `fit()` trains, saves and exports."""

    def __init__(self, spec: RunSpec):
        import deepspeed
        import torch
        import torch.distributed as torch_dist

        # DeepSpeed calls torch.distributed's deprecated collectives on every step; keep the log readable.
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

        self.spec = spec
        self.ds_config = json.loads((spec.out / "ds_config.json").read_text())
        deepspeed.init_distributed()
        self.dist = torch_dist
        self.rank = torch_dist.get_rank()
        self.world = torch_dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.torch = torch
        torch.manual_seed(spec.seed)

        self.tokenizer = self._load_tokenizer()
        self.rows, self.held_out = self._load_data()
        # A live HfDeepSpeedConfig (kept referenced) makes from_pretrained partition the weights under ZeRO-3
        self.model, self._hf_ds_config = load_model(spec, self.ds_config, self.log)
        self.frozen_digest = adapter.frozen_digest(self.model) if spec.lora else None
        self.frozen_base_unchanged: bool | None = None  # fit() compares the frozen base with frozen_digest
        self.engine, *_ = deepspeed.initialize(
            model=self.model,
            model_parameters=[p for p in self.model.parameters() if p.requires_grad],
            config=self.ds_config,
        )
        self.optimizer_class = type(self.engine.basic_optimizer).__name__
        self.zero = self.ds_config.get("zero_optimization", {})
        self.grad_accum = int(self.ds_config["gradient_accumulation_steps"])
        self.micro_batch = int(self.ds_config["train_micro_batch_size_per_gpu"])
        self.tokens_per_step = self.micro_batch * self.grad_accum * self.world * spec.seq_len
        self.checkpoints = CheckpointStore(self.engine, spec, self.rank, self.zero, self.log)
        self.gpu_memory = GpuMemory(torch, self.engine.device) if on_cuda(torch, self.engine.device) else None
        self.gpu_peaks = GpuPeaks()
        # this rank's peak RSS with its children's (progress.peak_rss_bytes), sampled after every step: a child
        # (ZenFlow's optimizer process) may be gone by the summary
        self.rss_peak = 0
        self.gpu_step: dict | None = None  # the last step's GPU figures, max over ranks
        self.phase_seconds: dict = {}  # the last step's seconds per phase (PhaseClock)
        self.step_tokens: dict = {}  # the last step's trained and masked tokens, all ranks (blocks.count_tokens)
        start_schedule_at_step_one(self.engine.lr_scheduler)
        if spec.nvme_swap_dir and self.local_rank == 0:  # says whose swap files these are (preflight reads it)
            Path(spec.nvme_swap_dir).mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(spec.nvme_swap_dir) / SWAP_OWNER_FILE, {"output_dir": str(spec.out.resolve())})

    # --------------------------------------------------------------------------------- loading

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[offload-launch] {message}", file=sys.stderr, flush=True)

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        source = self.spec.tokenizer or self.spec.model
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=self.spec.trust_remote_code)
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"tokenizer from {source} has no EOS token; documents cannot be separated")
        return tokenizer

    def _load_data(self):
        """(training rows, held-out rows or None), as the CLI tokenized them into OUT/cache (blocks.load_splits)."""
        from launcher.data.blocks import load_splits

        spec = self.spec

        def load():
            return load_splits(
                spec.data,
                spec.rows_layout(),
                self.tokenizer,
                spec.out / "cache",
                eval_data=spec.eval_data,
                eval_fraction=spec.eval_fraction,
            )

        # Rank 0 tokenizes and fills the cache; the others then read it instead of tokenizing again.
        if self.rank == 0:
            rows, held = load()
        self.dist.barrier()
        if self.rank != 0:
            rows, held = load()
        layout = spec.rows_layout()
        kept = f", {len(held):,} held out for the eval loss" if held is not None else ""
        self.log(f"data: {len(rows):,} rows of {spec.seq_len} tokens ({layout.format}, {layout.packing}){kept}")
        return rows, held

    # --------------------------------------------------------------------------------- steps

    def batches(self, order: BlockOrder, step: int) -> Callable[[int], dict]:
        """Micro-batch -> the model's inputs of optimizer step `step` (1-based) on this rank, in BlockOrder's
        order."""

        def batch(micro: int) -> dict:
            return self.inputs(order.batch((step - 1) * self.grad_accum + micro, self.micro_batch))

        return batch

    def inputs(self, rows: list[int], token_set=None) -> dict:
        """The model's keyword arguments for these rows (TokenSet.inputs), on the engine's device."""
        arrays = (token_set or self.rows).inputs(rows)
        return {name: self.torch.from_numpy(array).to(self.engine.device) for name, array in arrays.items()}

    def first_batch(self) -> dict:
        """This rank's first micro-batch (the smoke checks train on it again and again)."""
        return self.inputs(BlockOrder(len(self.rows), self.world, self.rank, self.spec.seed).batch(0, self.micro_batch))

    def train_step(self, batch: Callable[[int], dict], step: int | None = None) -> float:
        """One optimizer step: forward and backward over the gradient-accumulation micro-batches (`batch(micro)`
        gives each one's inputs); the loss averaged over micro-batches and ranks. Collective. `step` names it
        for the kill-point drill (KILL_AT_ENV=step:N fires after its first backward); None for an extra step."""
        from launcher.data.rows import count_tokens

        torch = self.torch
        if self.gpu_memory is not None:
            self.gpu_memory.start_step()
        totals = torch.zeros(3, dtype=torch.float64, device=self.engine.device)  # loss sum, trained, masked
        clock = PhaseClock(self.synchronize)
        for micro in range(self.grad_accum):
            inputs = batch(micro)
            with self.saved_activations():
                loss = self.engine(**inputs).loss
            self.engine.backward(loss)
            if step is not None:
                kill_point("step", step, self.rank)
            last = micro == self.grad_accum - 1
            # The clock synchronizes only around the optimizer step (twice per step, not per micro-batch): a
            # synchronize after every backward would stall the host from queueing the next forward. "passes" is
            # every forward and backward with the gradient copies they overlap (and the no-op steps between).
            if last:
                clock.lap("passes")
            self.engine.step()  # the optimizer step runs at the boundary, after the last micro-batch
            if last:
                clock.lap("update")
            counts = count_tokens(inputs, self.spec.model_kind == "seq2seq-lm")
            totals[0] += loss.detach().double()
            totals[1] += counts["trained"]
            totals[2] += counts["masked"]
        self.dist.all_reduce(totals)
        self.phase_seconds = clock.seconds
        self.step_tokens = {"trained_tokens": int(totals[1].item()), "masked_tokens": int(totals[2].item())}
        if self.gpu_memory is not None:
            self.gpu_step = self._gather_gpu_step(*self.gpu_memory.end_step())
        return totals[0].item() / (self.grad_accum * self.world)

    def evaluate(self) -> float:
        """The loss over the held-out rows (at most EVAL_MAX_ROWS), weighted by each micro-batch's trained tokens
        (a model's loss is the mean over its batch's). Collective: every rank runs as many forwards (ZeRO-3
        gathers the parameters for each); a rank short of rows repeats one with its labels ignored (-100)."""
        from launcher.data.rows import IGNORE, count_tokens

        torch, held = self.torch, self.held_out
        seq2seq = self.spec.model_kind == "seq2seq-lm"
        n = min(len(held), EVAL_MAX_ROWS)
        mine = list(range(self.rank, -(-n // self.world) * self.world, self.world))
        totals = torch.zeros(2, dtype=torch.float64, device=self.engine.device)  # loss x tokens, tokens
        self.engine.eval()
        with torch.no_grad():
            for start in range(0, len(mine), self.micro_batch):
                rows = mine[start : start + self.micro_batch]
                inputs = self.inputs([row % n for row in rows], held)
                for i, row in enumerate(rows):
                    if row >= n:  # a repeat, only so that every rank runs the same forwards
                        inputs["labels"][i] = IGNORE
                tokens = count_tokens(inputs, seq2seq)["trained"]
                loss = self.engine(**inputs).loss
                if tokens:
                    totals[0] += loss.double() * tokens
                    totals[1] += tokens
        self.engine.train()
        self.dist.all_reduce(totals)
        return totals[0].item() / totals[1].item() if totals[1].item() else float("nan")

    def saved_activations(self):
        """Where the forward's saved tensors wait for the backward: with the activations offloaded (the plan's
        act->cpu, host_buffers.py [act-offload]) in CPU memory, pinned on CUDA (torch.autograd.graph.save_on_cpu; the
        CPU accelerator has nothing to pin); else where autograd keeps them."""
        if not self.spec.offload_activations:
            return contextlib.nullcontext()
        pin = on_cuda(self.torch, self.engine.device)
        return self.torch.autograd.graph.save_on_cpu(pin_memory=pin)

    def synchronize(self) -> None:
        """Wait for the device's queued work, so that a phase's clock stops when its work has (CUDA launches are
        asynchronous; DeepSpeed's CPU accelerator is synchronous and this returns at once)."""
        if on_cuda(self.torch, self.engine.device):
            self.torch.cuda.synchronize(self.engine.device)

    def _gather_gpu_step(self, figures: dict, source: str) -> dict:
        """This step's GPU figures, the largest rank's (each figure on its own), added to the run's peaks.
        Collective: every rank measured its own device."""
        values = max_over_ranks(self.dist, gpu_figures_vector(figures, source), self.engine.device)
        figures, source = gpu_figures_from_vector(values)
        self.gpu_peaks.add(figures, source)
        return figures

    # --------------------------------------------------------------------------------- loop

    def fit(self) -> dict:
        """Train from the newest complete checkpoint (or from the start) to --steps, saving on the way, then
        export OUT/final and remove the swap files; the summary for run.json."""
        start = time.perf_counter()
        first_step = self.checkpoints.resume() + 1
        metrics_path = self.spec.out / METRICS_FILE
        if self.rank == 0:
            trim_metrics(metrics_path, first_step - 1)
        metrics = Metrics(metrics_path, enabled=self.rank == 0)
        self._train(first_step, metrics)
        self.frozen_base_unchanged = self._frozen_base_unchanged()
        drop_optimizer_state(self.engine)  # the last step saved a checkpoint: resuming needs nothing in memory
        zero3 = self.planned_placement()[0] == 3
        if self.spec.lora:
            final = adapter.export_adapter(self.engine, self.tokenizer, self.spec.out, self.rank, zero3, FINAL_DIR)
            if self.spec.merge:
                adapter.export_merged(self.spec, self.tokenizer, final, self.rank, MERGED_DIR)
        else:
            export_final(self.engine, self.tokenizer, self.spec.out, self.rank, zero3)
        nvme_bytes = folder_bytes(self.spec.nvme_swap_dir)
        self.remove_swap_files()
        return self.summary(metrics, time.perf_counter() - start, nvme_bytes)

    def _train(self, first_step: int, metrics: Metrics) -> None:
        spec = self.spec
        order = BlockOrder(len(self.rows), self.world, self.rank, spec.seed)
        progress = Progress(enabled=self.rank == 0, total=spec.steps, initial=first_step - 1)
        self.engine.train()
        for step in range(first_step, spec.steps + 1):
            t0 = time.perf_counter()
            # dropout's masks (a LoRA's, a model's own) follow the step, so a resumed run draws the same ones
            self.torch.manual_seed(step_seed(spec.seed, step, self.rank))
            lr = self.engine.optimizer.param_groups[0]["lr"]  # the rate this step applies
            loss = self.train_step(self.batches(order, step), step)
            seconds = time.perf_counter() - t0
            skipped = int(self.engine.skipped_steps)
            record = step_record(step, loss, lr, self.tokens_per_step, seconds, skipped, self.gpu_step)
            saves = (spec.save_every and step % spec.save_every == 0) or step == spec.steps
            due = step % spec.eval_every == 0 if spec.eval_every else saves  # and always after the last step
            if self.held_out is not None and (due or step == spec.steps):
                record["eval_loss"] = self.evaluate()
            metrics.add({**record, **self.step_tokens, **self.phase_seconds})
            progress.update(loss, self.tokens_per_step / seconds)
            if not math.isfinite(loss):
                progress.close()
                raise SystemExit(f"loss is {loss} at step {step}; lower --lr or check the data")
            if saves:
                self.checkpoints.save(step)
            self.rss_peak = max(self.rss_peak, peak_rss_bytes())
        progress.close()

    def summary(self, metrics: Metrics, wall: float, nvme_bytes: int) -> dict:
        """run.json's contents (progress.run_summary). Collective: it gathers every rank's peak RSS."""
        peak, cpu_per_node = self.cpu_peaks()
        measured = measured_figures(
            metrics.step_seconds,
            self.tokens_per_step,
            cpu_per_node,
            nvme_bytes,
            self.gpu_peaks.measured(),
            metrics.phase_seconds,
        )
        stage, optimizer_at, param_at = self.planned_placement()
        setup = {
            "optimizer": self.optimizer_class,
            "world_size": self.world,
            "zero_stage": stage,
            "offload_optimizer": optimizer_at,
            "offload_param": param_at,
            **self.optimizer_layout(),
            "model_class": AUTO_CLASSES[self.spec.model_kind],
            "adapter": self.spec.lora,  # None: every weight trained, OUT/final is the whole model
            "frozen_base_unchanged": self.frozen_base_unchanged,  # None: nothing frozen
            "data": self.data_summary(),
            "ranks": self.rank_environments(),
        }
        return run_summary(self.spec, setup, metrics.records, wall, peak, measured, self.checkpoints.skipped)

    def _frozen_base_unchanged(self) -> bool | None:
        """Whether every rank's frozen base (its ZeRO-3 partition) holds the bytes it loaded: a LoRA trains only
        the adapter (adapter.frozen_digest). Collective; None without an adapter."""
        if self.frozen_digest is None:
            return None
        unchanged = adapter.frozen_digest(self.engine.module) == self.frozen_digest
        same = self.torch.tensor([int(unchanged)], device=self.engine.device)
        self.dist.all_reduce(same, op=self.dist.ReduceOp.MIN)
        return bool(same.item())

    def rank_environments(self) -> list[dict]:
        """Where each rank ran and what its environment gave it (the host, the threads its torch and CPU-Adam use,
        the accelerator): the proof that every node's ranks got the launch's variables (job/nodes.py). Collective."""
        import socket

        mine = {
            "rank": self.rank,
            "host": socket.gethostname(),
            "node_rank": node_rank(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": self.torch.get_num_threads(),
            "accelerator": os.environ.get("DS_ACCELERATOR"),
        }
        everyone: list = [None] * self.world
        self.dist.all_gather_object(everyone, mine)
        return everyone

    def data_summary(self) -> dict:
        """What the rows are: the data's format and layout, how many rows (held out too) and what tokenizing
        found (records read, skipped with nothing to train on, cut at --seq-len)."""
        layout = self.spec.rows_layout()
        summary = {"format": layout.format, "packing": layout.packing, "rows": len(self.rows), **self.rows.stats}
        if self.held_out is not None:
            summary["eval_rows"] = min(len(self.held_out), EVAL_MAX_ROWS)
        return summary

    # --------------------------------------------------------------------------------- resources

    def optimizer_layout(self) -> dict:
        """What DeepSpeed really built for the optimizer, read from its ZeRO optimizer: the dtype of the master
        weights and states, and with a partial offload how many sub-groups it keeps on the device
        (stage3.py `subgroup_to_device`)."""
        optimizer = self.engine.optimizer
        layout = {}
        dtype = getattr(optimizer, "master_weights_and_grads_dtype", None)
        if dtype is not None:
            layout["optimizer_states_dtype"] = str(dtype).removeprefix("torch.")
        split = getattr(optimizer, "subgroup_to_device", None)  # ZeRO-3 with the optimizer offloaded
        if split:
            # stage3.py `_create_fp32_partitions`: sub-group i stays on the device when i < int((1 - ratio) x
            # groups); on the CPU accelerator that device is the CPU too, so the rule is applied, not the names read
            ratio = self.zero.get("offload_optimizer", {}).get("ratio", 1.0)
            on_device = int((1 - ratio) * len(split))
            layout["optimizer_subgroups"] = {"device": on_device, "cpu": len(split) - on_device}
        return layout

    def planned_placement(self) -> tuple[int, str, str]:
        """(ZeRO stage, optimizer state device, parameter device) as the ds_config asks for them."""
        return (
            self.zero.get("stage", 0),
            self.zero.get("offload_optimizer", {}).get("device", "none"),
            self.zero.get("offload_param", {}).get("device", "none"),
        )

    def gpu_bytes_per_device(self) -> int | None:
        """The plan's GPU figure as measured: the largest step's peak (reserved + outside the allocator), max
        over ranks, over the steps so far; None on the CPU accelerator or before a step. Not collective (each
        step gathered its figures already), so every rank has the same answer."""
        measured = self.gpu_peaks.measured()
        return measured["gpu_bytes_per_device"] if measured else None

    gpu_reserved_bytes = gpu_bytes_per_device  # the name smoke_checks.memory_check calls

    def cpu_peaks(self) -> tuple[int, int]:
        """(the largest rank's peak RSS, the peak RSS of a node's ranks summed). Collective. The tensors live
        on the engine's device: NCCL reduces no CPU tensors."""
        torch = self.torch
        own = max(self.rss_peak, peak_rss_bytes())
        peak = torch.tensor([float(own)], dtype=torch.float64, device=self.engine.device)
        total = peak.clone()
        self.dist.all_reduce(peak, op=self.dist.ReduceOp.MAX)
        self.dist.all_reduce(total)
        return int(peak.item()), int(total.item()) // max(1, node_count(self.world, os.environ))

    def remove_swap_files(self) -> None:
        """A finished run leaves no NVMe swap files behind (a killed one reuses them on resume)."""
        if self.spec.nvme_swap_dir:
            self.dist.barrier()
            if self.local_rank == 0:
                shutil.rmtree(self.spec.nvme_swap_dir, ignore_errors=True)

    def close(self) -> None:
        """Destroy the process group so a clean run ends without abort messages."""
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()


def step_seed(seed: int, step: int, rank: int) -> int:
    """The RNG seed of optimizer step `step` on `rank`: distinct per step and rank, the same on a resume."""
    return (seed * 1_000_003 + step) * 4_099 + rank


def on_cuda(torch, device) -> bool:
    """Whether the engine runs on a CUDA device (not DeepSpeed's CPU accelerator, even on a GPU host)."""
    return torch.device(device).type == "cuda"


def start_schedule_at_step_one(scheduler) -> None:
    """Make optimizer step k run at the schedule's iteration k. DeepSpeed's WarmupLR and WarmupDecayLR
    (runtime/lr_schedules.py) set iteration -1's rate (warmup_min_lr) when they are built and iteration 0's
    (warmup_min_lr again) after the first step, so the first two steps would both run at 0 and the warm-up
    would end a step late. Starting at iteration 1 gives the first step lr / warmup_steps. A resumed run loads
    the iteration from its checkpoint afterwards; other schedulers (a --ds-config's own) are left alone."""
    if type(scheduler).__name__ in ("WarmupLR", "WarmupDecayLR") and scheduler.last_batch_iteration == -1:
        scheduler.step(1)
