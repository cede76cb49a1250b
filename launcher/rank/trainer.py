"""Per-rank training entry point, started by DeepSpeed's launcher:

    python -m deepspeed.launcher.runner ... --no_local_rank --module launcher.rank --run-spec OUT/run_spec.json

It knows nothing about planning: it reads a run spec (paths, steps, seed) and OUT/ds_config.json, so a
user can also start it under their own launcher. Every rank runs this file; rank 0 writes the files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import statistics
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from launcher.data.sampling import BlockOrder
from launcher.files import folder_bytes, write_json_atomic
from launcher.job.rundir import SWAP_OWNER_FILE
from launcher.job.spec import WARMUP_STEPS_EXCLUDED, RunSpec
from launcher.units import fmt_bytes

COMPLETE_MARKER = "complete.json"  # written last: a checkpoint without it is never resumed from
# Fault drills: OFFLOAD_LAUNCH_KILL_AT=step:N kills rank 0 with SIGKILL in the middle of step N (after the
# first backward), =checkpoint:N after DeepSpeed wrote checkpoint N but before its completion marker. Used by
# the fault tests, and by anyone who wants to see their own setup survive a crash before trusting it.
KILL_AT_ENV = "OFFLOAD_LAUNCH_KILL_AT"
CHECKPOINT_BYTES_PER_PARAM = 2 + 12  # 16-bit module + fp32 master and Adam's two moments (ZeRO paper, 16 B - grads)


# ------------------------------------------------------------------------------------------- files


def complete_checkpoints(checkpoint_dir: Path) -> list[tuple[int, str]]:
    """(step, tag) of every checkpoint whose completion marker exists, oldest first."""
    found = []
    if checkpoint_dir.is_dir():
        for marker in checkpoint_dir.glob(f"*/{COMPLETE_MARKER}"):
            with contextlib.suppress(ValueError, KeyError, OSError):
                found.append((int(json.loads(marker.read_text())["step"]), marker.parent.name))
    return sorted(found)


def discard_incomplete(checkpoint_dir: Path) -> list[str]:
    """Remove checkpoint folders without a completion marker: a run stopped while writing them. They are never
    resumed from, and removing them gives their disk space back before the next save."""
    complete = {tag for _step, tag in complete_checkpoints(checkpoint_dir)}
    removed = []
    if checkpoint_dir.is_dir():
        for folder in sorted(checkpoint_dir.iterdir()):
            if folder.is_dir() and folder.name not in complete:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
    return removed


def kill_point(where: str, step: int, rank: int) -> None:
    """SIGKILL this rank (rank 0 only) when OFFLOAD_LAUNCH_KILL_AT names this point: a real crash, on cue."""
    if rank == 0 and os.environ.get(KILL_AT_ENV) == f"{where}:{step}":
        print(f"[offload-launch] {KILL_AT_ENV}={where}:{step}: killing rank 0", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def trim_metrics(path: Path, last_step: int) -> None:
    """Keep the metrics of steps <= last_step: steps after the checkpoint are trained again on resume,
    so each step appears exactly once."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ------------------------------------------------------------------------------------------- training


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
        self.blocks = self._load_data()
        self.model = self._load_model()
        self.engine, *_ = deepspeed.initialize(
            model=self.model,
            model_parameters=[p for p in self.model.parameters() if p.requires_grad],
            config=self.ds_config,
        )
        self.optimizer_class = type(self.engine.basic_optimizer).__name__
        self.zero = self.ds_config.get("zero_optimization", {})
        self.grad_accum = int(self.ds_config["gradient_accumulation_steps"])
        self.micro_batch = int(self.ds_config["train_micro_batch_size_per_gpu"])
        self.skipped_saves: list[int] = []  # checkpoints skipped for lack of disk space
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
        from launcher.data.sources import inspect_data, load_token_blocks

        source = inspect_data(self.spec.data, self.spec.text_field)
        cache = self.spec.out / "cache"

        def load():
            return load_token_blocks(source, self.tokenizer, self.spec.seq_len, self.spec.text_field, cache)

        # Rank 0 tokenizes and fills the cache; the others then read it instead of tokenizing again.
        if self.rank == 0:
            blocks = load()
        self.dist.barrier()
        if self.rank != 0:
            blocks = load()
        self.log(f"data: {len(blocks):,} blocks of {self.spec.seq_len} tokens from {self.spec.data}")
        return blocks

    def _load_model(self):
        from transformers import AutoConfig, AutoModelForCausalLM

        dtype = self.torch.bfloat16 if self.ds_config.get("bf16", {}).get("enabled") else self.torch.float16
        if self.ds_config.get("zero_optimization", {}).get("stage") == 3:
            # A live HfDeepSpeedConfig makes from_pretrained/from_config run under deepspeed.zero.Init, so
            # weights are partitioned as they load and no rank holds a full copy (DeepSpeed issues 1814, 5617).
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_ds_config = HfDeepSpeedConfig(self.ds_config)  # must stay referenced
        kwargs = {"trust_remote_code": self.spec.trust_remote_code}
        if _has_weights(self.spec.model):
            model = AutoModelForCausalLM.from_pretrained(self.spec.model, dtype=dtype, **kwargs)
        else:
            self.log(f"warning: no weights in {self.spec.model}: starting from random initialization")
            config = AutoConfig.from_pretrained(self.spec.model, **kwargs)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
        if self.spec.activation_checkpointing:
            # transformers 5.x renamed gradient_checkpointing_enable (and its kwargs argument).
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        return model

    # --------------------------------------------------------------------------------- loop

    def resume_step(self) -> int:
        """Load the newest complete checkpoint; the optimizer step to continue after (0 = fresh)."""
        if not self.spec.resume:
            return 0
        if self.rank == 0:
            for tag in discard_incomplete(self.spec.checkpoint_dir):
                self.log(f"removed incomplete checkpoint {tag} (the run stopped while writing it)")
        self.dist.barrier()
        checkpoints = complete_checkpoints(self.spec.checkpoint_dir)
        if not checkpoints:
            return 0
        step, tag = checkpoints[-1]
        load_path, client_state = self.load_checkpoint(self.spec.checkpoint_dir, tag)
        if load_path is None:
            raise SystemExit(f"checkpoint {self.spec.checkpoint_dir / tag} could not be loaded")
        self.log(f"resumed from {tag} (step {step})")
        return int(client_state.get("step", step))

    def fit(self) -> dict:
        spec, torch = self.spec, self.torch
        start = time.perf_counter()
        first_step = self.resume_step() + 1
        metrics_path = spec.out / "metrics.jsonl"
        if self.rank == 0:
            trim_metrics(metrics_path, first_step - 1)
        order = BlockOrder(len(self.blocks), self.world, self.rank, spec.seed)
        tokens_per_step = self.micro_batch * self.grad_accum * self.world * spec.seq_len
        progress = _Progress(enabled=self.rank == 0, total=spec.steps, initial=first_step - 1)
        history = _read_losses(metrics_path) if self.rank == 0 else []
        step_seconds: list[float] = []
        self.engine.train()
        for step in range(first_step, spec.steps + 1):
            t0 = time.perf_counter()
            lr = self.engine.optimizer.param_groups[0]["lr"]  # the rate this step applies
            loss_sum = torch.zeros((), dtype=torch.float32, device=self.engine.device)
            for micro in range(self.grad_accum):
                index = order.batch((step - 1) * self.grad_accum + micro, self.micro_batch)
                ids = torch.from_numpy(self.blocks[index]).to(self.engine.device)
                loss = self.engine(input_ids=ids, labels=ids).loss
                self.engine.backward(loss)
                kill_point("step", step, self.rank)
                self.engine.step()
                loss_sum += loss.detach().float()
            self.dist.all_reduce(loss_sum)
            loss_value = loss_sum.item() / (self.grad_accum * self.world)
            seconds = time.perf_counter() - t0
            step_seconds.append(seconds)
            record = {
                "step": step,
                "loss": loss_value,
                "lr": lr,
                "tokens": tokens_per_step,
                "tokens_per_s": tokens_per_step / seconds,
                "step_seconds": seconds,
                "cpu_peak_rss_bytes": peak_rss_bytes(),
                "skipped_steps": int(self.engine.skipped_steps),  # fp16 overflows (DeepSpeed skips the update)
            }
            if torch.cuda.is_available():
                record["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
            if self.rank == 0:
                _append_jsonl(metrics_path, record)
                history.append(loss_value)
            progress.update(loss_value, tokens_per_step / seconds)
            if not math.isfinite(loss_value):
                progress.close()
                raise SystemExit(f"loss is {loss_value} at step {step}; lower --lr or check the data")
            if (spec.save_every and step % spec.save_every == 0) or step == spec.steps:
                self.save_checkpoint(step)
        progress.close()
        self.export()
        nvme_bytes = folder_bytes(self.spec.nvme_swap_dir)
        self.remove_swap_files()
        return self.summary(history, step_seconds, time.perf_counter() - start, nvme_bytes)

    def save_checkpoint(self, step: int) -> None:
        """DeepSpeed checkpoint, then the completion marker (rank 0, after every rank finished writing),
        then old checkpoints beyond --keep-checkpoints are removed - so the previous checkpoint stays intact
        until the new one is complete.

        A disk without room for it skips this save (every rank agrees) with a warning and training goes on:
        the next save tries again. A write that fails anyway (the disk filled meanwhile) removes the partial
        folder and stops the run with the reason; rerunning resumes from the previous checkpoint."""
        tag = f"step{step}"
        folder = self.spec.checkpoint_dir / tag
        self.spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        needed = self.checkpoint_bytes()
        free = shutil.disk_usage(self.spec.checkpoint_dir).free
        room = self.torch.tensor([1 if free >= needed else 0], device=self.engine.device)
        self.dist.all_reduce(room, op=self.dist.ReduceOp.MIN)
        if not room.item():
            self.log(
                f"warning: checkpoint {tag} skipped: it needs about {fmt_bytes(needed)} and {self.spec.checkpoint_dir} "
                f"has {fmt_bytes(free)} free on some rank; {self._previous_checkpoint()}; "
                "free space there (the next save tries again)"
            )
            self.skipped_saves.append(step)
            return
        try:
            self.write_checkpoint(self.spec.checkpoint_dir, tag, step)
        except (OSError, RuntimeError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise SystemExit(
                f"[offload-launch] checkpoint {tag} failed while writing to {self.spec.checkpoint_dir}: "
                f"{' '.join(str(exc).split())[:200]}; removed the partial folder; {self._previous_checkpoint()}; "
                "free space (df -h) and rerun the same command to resume"
            ) from None
        kill_point("checkpoint", step, self.rank)
        self.dist.barrier()
        if self.rank == 0:
            write_json_atomic(folder / COMPLETE_MARKER, {"step": step, "time": time.time()})
            for _old_step, old_tag in complete_checkpoints(self.spec.checkpoint_dir)[: -self.spec.keep_checkpoints]:
                shutil.rmtree(self.spec.checkpoint_dir / old_tag, ignore_errors=True)
        self.dist.barrier()

    def write_checkpoint(self, folder: Path, tag: str, step: int) -> None:
        """DeepSpeed's save_checkpoint (with the optimizer on NVMe it also copies the swap files - fp32
        weights and Adam's moments - into TAG/offloaded_tensors). Collective: every rank calls it."""
        self.engine.save_checkpoint(str(folder), tag=tag, client_state={"step": step})

    def load_checkpoint(self, folder: Path, tag: str):
        """DeepSpeed's load_checkpoint, then - with ZeRO-3 and the optimizer on NVMe - the 16-bit weights
        refreshed from the restored fp32 ones. DeepSpeed 0.19 copies the swap files back only after it
        rebuilt the 16-bit partitions, and skips that rebuild for swapped-out groups, so the weights the next
        forward pass uses would be the ones from before the load (the smoke checkpoint check caught it)."""
        load_path, client_state = self.engine.load_checkpoint(str(folder), tag=tag)
        if load_path is not None and self._optimizer_swapped():
            import deepspeed
            from deepspeed.utils import safe_get_full_fp32_param

            for param in self.engine.module.parameters():
                full = safe_get_full_fp32_param(param)  # collective: every rank, same order
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if self.rank == 0:
                        param.data.copy_(full.reshape(param.shape).to(param.dtype))
            self.log(f"refreshed the 16-bit weights of {tag} from its fp32 weights (optimizer on NVMe)")
        scheduler = self.engine.lr_scheduler
        if load_path is not None and scheduler is not None and hasattr(scheduler, "get_lr"):
            # The restored schedule's rate for the next step; with the optimizer on NVMe DeepSpeed leaves the
            # optimizer's own learning rate at 0 until the scheduler steps again (one update lost otherwise).
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_lr(), strict=False):
                group["lr"] = lr
        return load_path, client_state

    def _optimizer_swapped(self) -> bool:
        return self.zero.get("stage") == 3 and self.zero.get("offload_optimizer", {}).get("device") == "nvme"

    def _previous_checkpoint(self) -> str:
        """What a failed or skipped save leaves to resume from, for its message."""
        newest = complete_checkpoints(self.spec.checkpoint_dir)
        return f"checkpoint {newest[-1][1]} is intact" if newest else "there is no earlier checkpoint"

    def checkpoint_bytes(self) -> int:
        """What the next checkpoint will take on disk: the newest complete one's size when there is one
        (exact), else 14 bytes per parameter (16-bit weights + fp32 master weights and two Adam moments)."""
        newest = complete_checkpoints(self.spec.checkpoint_dir)
        if newest:
            return folder_bytes(str(self.spec.checkpoint_dir / newest[-1][1]))
        params = sum(getattr(p, "ds_numel", p.numel()) for p in self.model.parameters())
        return CHECKPOINT_BYTES_PER_PARAM * params

    def export(self) -> None:
        """OUT/final: weights consolidated from the ZeRO shards, saved with save_pretrained, plus the
        tokenizer, so AutoModelForCausalLM.from_pretrained(OUT/final) loads it."""
        if self.zero.get("stage") == 3:
            state_dict = self.engine._zero3_consolidated_16bit_state_dict()  # collective: every rank calls
        else:
            state_dict = self.engine.module.state_dict() if self.rank == 0 else None
        if self.rank == 0:
            final, tmp = self.spec.out / "final", self.spec.out / "final.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            self.engine.module.save_pretrained(tmp, state_dict=state_dict)
            self.tokenizer.save_pretrained(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        self.dist.barrier()

    def summary(self, history: list[float], step_seconds: list[float], wall: float, nvme_bytes: int) -> dict:
        """run.json: what ran, and the plan's predictions next to what was measured, with their ratios."""
        torch = self.torch
        peak, cpu_per_node = self._cpu_peaks()
        measured_steps = step_seconds[WARMUP_STEPS_EXCLUDED:] or step_seconds
        median = statistics.median(measured_steps) if measured_steps else None
        tokens_per_step = self.micro_batch * self.grad_accum * self.world * self.spec.seq_len
        offload = {k: self.zero.get(f"offload_{k}", {}).get("device", "none") for k in ("optimizer", "param")}
        measured = {
            "step_seconds": median,  # median after the warm-up step
            "tokens_per_s": tokens_per_step / median if median else None,
            "cpu_bytes_per_node": cpu_per_node,  # peak RSS of this node's ranks, summed
            "nvme_bytes_per_node": nvme_bytes,  # swap files at the end of training
        }
        if torch.cuda.is_available():
            measured["gpu_bytes_per_device"] = torch.cuda.max_memory_reserved()  # what the allocator held
        predicted = self.spec.predicted
        ratios = {
            key: measured[key] / predicted[key]
            for key in ("step_seconds", "gpu_bytes_per_device", "cpu_bytes_per_node", "nvme_bytes_per_node")
            if measured.get(key) and predicted.get(key)
        }
        return {
            "optimizer": self.optimizer_class,
            "world_size": self.world,
            "zero_stage": self.zero.get("stage", 0),
            "offload_optimizer": offload["optimizer"],
            "offload_param": offload["param"],
            "steps": self.spec.steps,
            "first_loss": history[0] if history else None,
            "final_loss": history[-1] if history else None,
            "wall_seconds": wall,
            "tokens_per_s": measured["tokens_per_s"],
            "peak_cpu_rss_bytes": peak,
            "predicted": predicted,
            "measured": measured,
            "ratios": ratios,
            "final_dir": str(self.spec.out / "final"),
            "skipped_checkpoints": list(self.skipped_saves),
        }

    # --------------------------------------------------------------------------------- smoke

    def smoke(self) -> list[dict]:
        """The in-training smoke checks (launcher/smoke.py): engine, loss, memory, checkpoint, nvme_cleanup.
        Every step trains on the same first batch: a model that cannot lower the loss on a batch it sees
        again is broken, whatever the learning-rate schedule."""
        from launcher.job.smoke import Check

        spec, torch = self.spec, self.torch
        checks = [self._engine_check()]
        order = BlockOrder(len(self.blocks), self.world, self.rank, spec.seed)
        ids = torch.from_numpy(self.blocks[order.batch(0, self.micro_batch)]).to(self.engine.device)
        t0 = time.perf_counter()
        losses: list[float] = []
        skipped_before = int(self.engine.skipped_steps)
        self.engine.train()
        for step in range(1, spec.steps + 1):
            kill_point("step", step, self.rank)
            losses.append(self._train_step(ids))
            self.log(f"smoke step {len(losses)}/{spec.steps} loss {losses[-1]:.4f}")
            if not math.isfinite(losses[-1]):
                break
        seconds = time.perf_counter() - t0
        # DeepSpeed skips an optimizer step whose gradients are not finite and says so only in its log: the
        # loss then looks finite while the model stopped learning.
        skipped = int(self.engine.skipped_steps) - skipped_before
        finite = all(math.isfinite(x) for x in losses)
        learned = finite and not skipped and len(losses) > 1 and losses[-1] < losses[0]
        if not finite:
            message = f"loss is {losses[-1]} at step {len(losses)}; lower --lr, or check the data and precision"
        elif skipped:
            message = (
                f"DeepSpeed skipped {skipped} of {len(losses)} optimizer steps: the gradients were not finite "
                "(overflow); lower --lr, or check the data and precision"
            )
        elif not learned:
            message = f"loss did not fall on a batch seen {len(losses)} times ({losses[0]:.4f} -> {losses[-1]:.4f})"
        else:
            message = f"{losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps on one batch, all finite"
        checks.append(Check("loss", learned, message, seconds, {"losses": losses, "skipped_steps": skipped}))
        checks.append(self._memory_check())
        if finite:
            checks.append(self._checkpoint_check(ids))
        else:
            checks.append(Check("checkpoint", None, "not run: the weights are no longer finite"))
        checks.append(self._nvme_cleanup_check())
        return [asdict(c) for c in checks]

    def _train_step(self, ids) -> float:
        loss_sum = self.torch.zeros((), dtype=self.torch.float32, device=self.engine.device)
        for _micro in range(self.grad_accum):
            loss = self.engine(input_ids=ids, labels=ids).loss
            self.engine.backward(loss)
            self.engine.step()
            loss_sum += loss.detach().float()
        self.dist.all_reduce(loss_sum)
        return loss_sum.item() / (self.grad_accum * self.world)

    def _engine_check(self):
        """What DeepSpeed actually built, read from its optimizer objects, against the ds_config."""
        from launcher.job.smoke import Check

        zero = self.zero
        planned = (
            zero.get("stage", 0),
            zero.get("offload_optimizer", {}).get("device", "none"),
            zero.get("offload_param", {}).get("device", "none"),
        )
        opt = self.engine.optimizer
        stage = self.engine.zero_optimization_stage()
        if stage == 3:
            optimizer_at = ("nvme" if opt.swap_optimizer else "cpu") if opt.offload_optimizer else "none"
            param_at = ("nvme" if opt.params_in_nvme_and_cpu else "cpu") if opt.offload_param else "none"
        else:
            optimizer_at = "cpu" if getattr(opt, "cpu_offload", False) else "none"
            param_at = "none"
        built = (stage, optimizer_at, param_at)
        problems = []
        if built != planned:
            problems.append(
                f"built ZeRO-{stage} with optimizer on {optimizer_at}, parameters on {param_at}; the plan "
                f"asked for ZeRO-{planned[0]} with optimizer on {planned[1]}, parameters on {planned[2]}"
            )
        if optimizer_at != "none" and self.optimizer_class != "DeepSpeedCPUAdam":
            problems.append(
                f"the offloaded optimizer is {self.optimizer_class}, not DeepSpeedCPUAdam (the Adam step on the "
                "CPU would be several times slower); remove torch_adam / zero_force_ds_cpu_optimizer: false"
            )
        message = "; ".join(problems) or (
            f"ZeRO-{stage}, optimizer on {optimizer_at}, parameters on {param_at}, {self.optimizer_class}"
        )
        details = {"built": list(built), "planned": list(planned), "optimizer": self.optimizer_class}
        return Check("engine", not problems, message, 0.0, details)

    def _memory_check(self):
        """Peak memory per tier against the plan's prediction: CPU RAM always (peak RSS of this node's ranks,
        summed), GPU memory when there is a GPU (what the caching allocator reserved)."""
        from launcher.job.smoke import Check

        torch = self.torch
        measured = {"cpu_bytes_per_node": self._cpu_peaks()[1]}
        if torch.cuda.is_available():
            measured["gpu_bytes_per_device"] = torch.cuda.max_memory_reserved()
        predicted = self.spec.predicted
        ratios = {k: v / predicted[k] for k, v in measured.items() if predicted.get(k)}
        limit = self.spec.smoke_memory_tolerance
        over = {k: r for k, r in ratios.items() if r > limit}
        parts = [
            f"{k.split('_')[0].upper()} {fmt_bytes(measured[k])} / predicted {fmt_bytes(predicted[k])} = {r:.2f}"
            for k, r in ratios.items()
        ]
        message = ", ".join(parts) + (f"; above the {limit:g} tolerance" if over else f" (tolerance {limit:g})")
        return Check("memory", not over, message, 0.0, {"measured": measured, "predicted": predicted, "ratios": ratios})

    def _weights(self) -> dict:
        """The full 16-bit weights, on every rank (ZeRO-3 gathers its partitions)."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), enabled=self.zero.get("stage") == 3):
            return {name: p.detach().clone().cpu() for name, p in params.items()}

    def _checkpoint_check(self, ids):
        """Save, train one more step (the weights move), load: the weights must be the saved ones exactly."""
        from launcher.job.smoke import Check

        t0 = time.perf_counter()
        folder = self.spec.out / "smoke-checkpoint"
        try:
            try:
                self.write_checkpoint(folder, "smoke", self.spec.steps)
                self.dist.barrier()
                saved = self._weights()
                self._train_step(ids)
                moved = self._weights()
                load_path, _ = self.load_checkpoint(folder, "smoke")
                restored = self._weights()
            except Exception as exc:  # noqa: BLE001 - a failure to save or load is what this check reports
                if self.world > 1:  # the other ranks may wait in a collective: fail the run, not just the check
                    raise
                message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                return Check("checkpoint", False, message, time.perf_counter() - t0)
            changed = sum(not self.torch.equal(saved[k], moved[k]) for k in saved)
            differ = [k for k in saved if not self.torch.equal(saved[k], restored[k])]
            size = folder_bytes(str(folder / "smoke"))
            self.dist.barrier()  # every rank has read the folder before rank 0 removes it
        finally:
            if self.rank == 0:
                shutil.rmtree(folder / "smoke", ignore_errors=True)
        seconds = time.perf_counter() - t0
        if load_path is None or differ:
            what = "could not be loaded" if load_path is None else f"{len(differ)} tensors differ, e.g. {differ[0]}"
            return Check("checkpoint", False, f"checkpoint saved ({fmt_bytes(size)}) but {what}", seconds)
        return Check(
            "checkpoint",
            True,
            f"saved {fmt_bytes(size)}, trained one more step ({changed}/{len(saved)} tensors moved), "
            f"loaded back: all {len(saved)} tensors identical",
            seconds,
        )

    def _nvme_cleanup_check(self):
        from launcher.job.smoke import Check

        if not self.spec.nvme_swap_dir:
            return Check("nvme_cleanup", True, "no NVMe offload in this plan: nothing to clean")
        used = folder_bytes(self.spec.nvme_swap_dir)
        self.remove_swap_files()
        self.dist.barrier()
        left = Path(self.spec.nvme_swap_dir)
        if left.exists():
            return Check("nvme_cleanup", False, f"{left} is still there ({fmt_bytes(folder_bytes(str(left)))})")
        return Check("nvme_cleanup", True, f"swap files ({fmt_bytes(used)} at the end) removed with {left}")

    def _cpu_peaks(self) -> tuple[int, int]:
        """(the largest rank's peak RSS, the peak RSS of a node's ranks summed). Collective. The tensors live
        on the engine's device: NCCL reduces no CPU tensors."""
        torch = self.torch
        peak = torch.tensor([float(peak_rss_bytes())], dtype=torch.float64, device=self.engine.device)
        total = peak.clone()
        self.dist.all_reduce(peak, op=self.dist.ReduceOp.MAX)
        self.dist.all_reduce(total)
        # DeepSpeed's launcher exports CROSS_SIZE (nodes) and LOCAL_SIZE (ranks on this node).
        nodes = int(os.environ.get("CROSS_SIZE") or max(1, self.world // int(os.environ.get("LOCAL_SIZE", self.world))))
        return int(peak.item()), int(total.item()) // max(1, nodes)

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


def _has_weights(model: str) -> bool:
    path = Path(model)
    if not path.is_dir():
        return True  # a hub id: from_pretrained fetches its weights
    return any(any(path.glob(pattern)) for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth"))


def _append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _read_losses(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if line.strip()]


class _Progress:
    """tqdm bar on a terminal (loss, tokens/s, ETA); a plain line every ~10 % when piped."""

    def __init__(self, enabled: bool, total: int, initial: int):
        self.enabled, self.total, self.step = enabled, total, initial
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        self.step += 1
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
            self.bar.update(1)
        elif self.step == self.total or self.step % max(1, self.total // 10) == 0 or self.step == 1:
            print(
                f"step {self.step}/{self.total} loss {loss:.4f} {tokens_per_s:,.0f} tokens/s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-spec", required=True, help="OUT/run_spec.json written by offload-launch")
    args = parser.parse_args(argv)
    spec = RunSpec.load(args.run_spec)
    trainer = Trainer(spec)
    try:
        if spec.smoke:
            from launcher.job.smoke import RESULT_FILE

            checks = trainer.smoke()
            if trainer.rank == 0:
                write_json_atomic(spec.out / RESULT_FILE, {"checks": checks})
            return 0
        summary = trainer.fit()
        if trainer.rank == 0:
            write_json_atomic(spec.out / "run.json", summary)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
