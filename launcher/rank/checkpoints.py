"""Checkpoints: which ones are complete, saving, loading and resuming, and the kill-point fault drill.

A checkpoint is OUT/checkpoints/stepN as DeepSpeed writes it, plus a completion marker (COMPLETE_MARKER) written
last, by rank 0, once every rank on every node finished writing: a folder without it was cut short and is never
resumed from (finding the complete ones is the run folder's business: launcher/job/rundir.py).

With node-local storage (--node-local-checkpoints) each node writes its ranks' shards into its own folder
(<root>/node<N>/stepN on its own disk) and its first rank writes that folder's marker, again once every rank on
every node finished. A resume loads the newest checkpoint that every node has complete, and refuses, naming the
node, when some node has none that the others have.
Old checkpoints beyond --keep-checkpoints are removed only after the new one is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from launcher.drills import kill_point
from launcher.files import folder_bytes, write_json_atomic
from launcher.job.rundir import COMPLETE_MARKER, complete_checkpoints, discard_incomplete
from launcher.job.spec import RunSpec, node_rank
from launcher.rank.adapter import check_checkpoint_keys
from launcher.units import fmt_bytes

CHECKPOINT_BYTES_PER_PARAM = 2 + 12  # 16-bit module + fp32 master and Adam's two moments (ZeRO paper, 16 B - grads)


# ------------------------------------------------------------------------------------------- files


def mark_complete(checkpoint_dir: Path, tag: str, step: int, keep: int) -> list[str]:
    """Write TAG's completion marker, then remove the complete checkpoints older than the newest `keep`;
    the tags removed. Rank 0 only, after every rank finished writing TAG."""
    write_json_atomic(checkpoint_dir / tag / COMPLETE_MARKER, {"step": step, "time": time.time()})
    removed = [old_tag for _old_step, old_tag in complete_checkpoints(checkpoint_dir)[:-keep]]
    for old_tag in removed:
        shutil.rmtree(checkpoint_dir / old_tag, ignore_errors=True)
    return removed


def previous_checkpoint(checkpoint_dir: Path) -> str:
    """What a failed or skipped save leaves to resume from, for its message."""
    newest = complete_checkpoints(checkpoint_dir)
    return f"checkpoint {newest[-1][1]} is intact" if newest else "there is no earlier checkpoint"


def checkpoint_bytes(checkpoint_dir: Path, params: int) -> int:
    """What the next checkpoint will take on disk: the newest complete one's size when there is one
    (exact), else 14 bytes per parameter (16-bit weights + fp32 master weights and two Adam moments)."""
    newest = complete_checkpoints(checkpoint_dir)
    if newest:
        return folder_bytes(str(checkpoint_dir / newest[-1][1]))
    return CHECKPOINT_BYTES_PER_PARAM * params


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


# ------------------------------------------------------------------------------------------- engine


class CheckpointStore:
    """One rank's checkpoint I/O through the DeepSpeed engine. Every method is collective: all ranks call it."""

    def __init__(self, engine, spec: RunSpec, rank: int, zero: dict, log: Callable[[str], None]):
        import torch.distributed as dist

        self.engine, self.spec, self.rank, self.zero, self.log = engine, spec, rank, zero, log
        self.dist = dist
        self.directory = spec.checkpoint_dir
        self.node_local = spec.node_local_checkpoints is not None
        # who looks after the folder (discards, marks complete, removes old ones): rank 0, or each node's first rank
        self.keeper = int(os.environ.get("LOCAL_RANK", "0")) == 0 if self.node_local else rank == 0
        self.skipped: list[int] = []  # steps whose checkpoint was skipped for lack of disk space

    def resume(self) -> int:
        """Load the newest complete checkpoint; the optimizer step to continue after (0 = fresh)."""
        if not self.spec.resume:
            if self.node_local and self.keeper:  # --no-resume: the CLI cannot reach the other nodes' disks
                discard_incomplete(self.directory, everything=True)
            self.dist.barrier()
            return 0
        if self.keeper:
            for tag in discard_incomplete(self.directory):
                self.log(f"removed incomplete checkpoint {tag} (the run stopped while writing it)")
        self.dist.barrier()
        checkpoints = complete_checkpoints(self.directory)
        if self.node_local:
            checkpoints = self._on_every_node(checkpoints)
        if not checkpoints:
            return 0
        step, tag = checkpoints[-1]
        load_path, client_state = self.load(self.directory, tag)
        if load_path is None:
            raise SystemExit(f"checkpoint {self.directory / tag} could not be loaded")
        self.log(f"resumed from {tag} (step {step})")
        return int(client_state.get("step", step))

    def _on_every_node(self, mine: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """Node-local storage: of this node's complete checkpoints, those every node has complete (collective).
        A node without any that the others have (its disk wiped or replaced, the hostfile reordered, which
        renumbers the nodes) stops the run with a message naming it."""
        import socket

        seen: list = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(seen, (node_rank(), socket.gethostname(), [step for step, _tag in mine]))
        nodes = {node: (host, set(steps)) for node, host, steps in seen}
        common = set.intersection(*(steps for _host, steps in nodes.values()))
        newest = max(set.union(*(steps for _host, steps in nodes.values())), default=0)
        if newest and not common:
            lacking = ", ".join(
                f"node {n} ({host})" for n, (host, steps) in sorted(nodes.items()) if newest not in steps
            )
            raise SystemExit(
                f"[offload-launch] cannot resume: {lacking} has no complete checkpoint that every node has in its "
                f"node-local folder {self.directory.parent}/node<N> (the newest, step {newest}, is on another node): "
                "restore that node's folder (the hostfile's order numbers the nodes), or rerun with --no-resume "
                "to start over"
            )
        if common and max(common) < newest:
            self.log(f"checkpoint step{newest} is not complete on every node: resuming from the newest that is")
        return [(step, tag) for step, tag in mine if step in common]

    def save(self, step: int) -> None:
        """DeepSpeed checkpoint, then the completion marker (rank 0, after every rank finished writing),
        then old checkpoints beyond --keep-checkpoints are removed - so the previous checkpoint stays intact
        until the new one is complete.

        A disk without room for it skips this save (every rank agrees) with a warning and training goes on:
        the next save tries again. A write that fails anyway (the disk filled meanwhile) removes the partial
        folder and stops the run with the reason; rerunning resumes from the previous checkpoint."""
        tag = f"step{step}"
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._room_for(tag):
            self.skipped.append(step)
            return
        try:
            self.write(self.directory, tag, step)
        except (OSError, RuntimeError) as exc:
            shutil.rmtree(self.directory / tag, ignore_errors=True)
            reason = " ".join(str(exc).split())[:200]
            raise SystemExit(
                f"[offload-launch] checkpoint {tag} failed while writing to {self.directory}: {reason}; removed the "
                f"partial folder; {previous_checkpoint(self.directory)}; "
                "free space (df -h) and rerun the same command to resume"
            ) from None
        kill_point("checkpoint", step, self.rank)
        self.dist.barrier()  # every rank on every node has written its part
        if self.keeper:
            mark_complete(self.directory, tag, step, self.spec.keep_checkpoints)
        self.dist.barrier()

    def _room_for(self, tag: str) -> bool:
        """Whether every rank's disk has room for the next checkpoint; warns when one has not."""
        import torch

        # an adapter's checkpoint holds the adapter alone (exclude_frozen_parameters, `write`)
        saved = [p for p in self.engine.module.parameters() if p.requires_grad or not self.spec.lora]
        params = sum(getattr(p, "ds_numel", p.numel()) for p in saved)
        needed = checkpoint_bytes(self.directory, params)
        free = shutil.disk_usage(self.directory).free
        room = torch.tensor([1 if free >= needed else 0], device=self.engine.device)
        self.dist.all_reduce(room, op=self.dist.ReduceOp.MIN)
        if not room.item():
            self.log(
                f"warning: checkpoint {tag} skipped: it needs about {fmt_bytes(needed)} and {self.directory} "
                f"has {fmt_bytes(free)} free on some rank; {previous_checkpoint(self.directory)}; "
                "free space there (the next save tries again)"
            )
        return bool(room.item())

    def write(self, folder: Path, tag: str, step: int) -> None:
        """DeepSpeed's save_checkpoint (with the optimizer on NVMe it also copies the swap files - fp32
        weights and Adam's moments - into TAG/offloaded_tensors). Collective: every rank calls it. An adapter's
        checkpoint leaves the frozen base out (DeepSpeed's exclude_frozen_parameters: at ZeRO-2/3 it would otherwise
        write the 16-bit base, at ZeRO-2 twice - engine.py `_save_checkpoint`, save_frozen_param); the base comes
        back from --model on resume."""
        self.engine.save_checkpoint(
            str(folder), tag=tag, client_state={"step": step}, exclude_frozen_parameters=bool(self.spec.lora)
        )

    def load(self, folder: Path, tag: str):
        """DeepSpeed's load_checkpoint, then - with ZeRO-3 and the optimizer on NVMe - what that load leaves
        stale restored from the checkpoint (restore_swapped_load), one optimizer sub-group at a time."""
        # An adapter's checkpoint has no frozen keys (`write`), which a strict load refuses as missing; the keys it
        # does have are checked instead (adapter.check_checkpoint_keys).
        adapter = bool(self.spec.lora)
        load_path, client_state = self.engine.load_checkpoint(str(folder), tag=tag, load_module_strict=not adapter)
        if load_path is not None and adapter:
            check_checkpoint_keys(self.engine, folder, tag)
        if load_path is not None and self._optimizer_swapped():
            saved = self._saved_zero_state(folder, tag)
            self._refresh_16bit_weights(saved)
            self.log(
                f"restored the optimizer state and refreshed the 16-bit weights of {tag} from its fp32 weights "
                "(optimizer on NVMe)"
            )
        scheduler = self.engine.lr_scheduler
        if load_path is not None and scheduler is not None and hasattr(scheduler, "get_lr"):
            # The restored schedule's rate for the next step; with the optimizer on NVMe DeepSpeed leaves the
            # optimizer's own learning rate at 0 until the scheduler steps again (one update lost otherwise).
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_lr(), strict=False):
                group["lr"] = lr
        return load_path, client_state

    def _saved_zero_state(self, folder: Path, tag: str) -> dict:
        """This rank's ZeRO optimizer file of TAG (DeepSpeed writes it with the optimizer on NVMe too, and its
        load_checkpoint then never reads it)."""
        path = self.engine._get_zero_ckpt_name(str(folder), tag)
        if not os.path.isfile(path):
            raise SystemExit(f"checkpoint {folder / tag} has no optimizer state for this rank ({Path(path).name})")
        return self.engine.checkpoint_engine.load(path, map_location="cpu")["optimizer_state_dict"]

    def _refresh_16bit_weights(self, saved: dict | None = None) -> None:
        """Each rank's 16-bit partitions from its restored fp32 partition, one ZeRO-3 sub-group at a time: the
        sub-group is swapped in from NVMe once, copied, and released (no write back: nothing in it changed), as
        DeepSpeed's own step does (stage3.py: _prepare_sub_group, _reassign_or_swap_out_partitioned_parameters,
        _release_sub_group). deepspeed.utils.safe_get_full_fp32_param per parameter would swap the parameter's
        whole sub-group in for each parameter. With `saved` (the ZeRO optimizer file's state) each sub-group's
        optimizer state is first restored from it (restore_swapped_load), so the swap-in reads Adam's moments
        too. Then the parameters ZeRO-3 keeps gathered (persistent) are gathered again from the new partitions.
        Collective only in that last gather."""
        optimizer = self.engine.optimizer
        sub_group_states = restore_swapped_load(optimizer, saved) if saved is not None else None
        for sub_group in range(len(optimizer.fp16_groups)):
            swapped = optimizer._swappable_optimizer_subgroup(sub_group)
            if sub_group_states is not None:
                restore_sub_group(optimizer, sub_group, swapped, sub_group_states[sub_group], saved)
            if swapped:
                optimizer._optimizer_states_and_gradient_swap_in(sub_group)
            optimizer._reassign_or_swap_out_partitioned_parameters(sub_group)
            if swapped:
                optimizer._release_swap_buffers(sub_group)
        optimizer.checkpoint_event_epilogue()

    def _optimizer_swapped(self) -> bool:
        return self.zero.get("stage") == 3 and self.zero.get("offload_optimizer", {}).get("device") == "nvme"


# ------------------------------------------------------------------------------------------- NVMe resume
#
# DeepSpeed 0.19.8's load_checkpoint with the optimizer on NVMe (runtime/engine.py, load_checkpoint) skips
# _load_zero_checkpoint (`if load_zero_checkpoint and not self.zero_nvme_offload_optimizer()`) and only copies
# TAG/offloaded_tensors back into the swap folder. So the ZeRO-3 optimizer's load_state_dict /
# _rigid_load_state_dict (runtime/zero/stage3.py) never runs and everything the swap files do not hold stays as
# the fresh process made it:
# - sub-groups under the swapper's min_aio_bytes (1 MiB: runtime/swap_tensor/optimizer_utils.py,
#   is_swappable_tensor) are never swapped: their fp32 weights and Adam moments live in memory only, so they stay
#   the initial weights and no moments;
# - every sub-group's Adam step count (an int in the base optimizer's state, never swapped), and for the swapped
#   sub-groups even the moments: the fresh optimizer has no state for them, so the swapper's swap info lists
#   only the fp32 weights (_update_param_state_info registers the state tensors it finds in optimizer.state),
#   the first step swaps in the weights alone, DeepSpeedCPUAdam (ops/adam/cpu_adam.py, step) starts at step 0
#   with zero moments, and the swap-out overwrites the restored exp_avg/exp_avg_sq files;
# - the loss scaler and the base optimizer's param groups (its learning rate among them).
# restore_swapped_load and restore_sub_group put them back from the ZeRO optimizer file DeepSpeed wrote next to
# the swap files (its _save_zero_checkpoint runs with NVMe too).


def restore_swapped_load(optimizer, saved: dict) -> list[dict]:
    """What _rigid_load_state_dict would have restored besides the sub-groups (the loss scaler, the base
    optimizer's param groups); each sub-group's saved optimizer state, in sub-group order. The base optimizer's
    state_dict numbers the sub-groups' fp32 partitions group by group (stage3.py: _set_fp32_optimizer_param_groups
    appends sub-group i to param group sub_group_to_group_id[i]); its param groups list those numbers."""
    optimizer.loss_scaler = saved["loss_scaler"]
    optimizer.dynamic_loss_scale = saved["dynamic_loss_scale"]
    optimizer.overflow = saved["overflow"]
    base_state = saved["optimizer_state_dict"]
    base = optimizer.optimizer
    states: list[dict] = [{} for _ in optimizer.fp16_groups]
    for group_id, (group, saved_group) in enumerate(zip(base.param_groups, base_state["param_groups"], strict=True)):
        group.update({key: value for key, value in saved_group.items() if key != "params"})
        sub_groups = [i for i in range(len(states)) if optimizer.sub_group_to_group_id[i] == group_id]
        for sub_group, index in zip(sub_groups, saved_group["params"], strict=True):
            states[sub_group] = base_state["state"].get(index, {})
    return states


def restore_sub_group(optimizer, sub_group: int, swapped: bool, state: dict, saved: dict) -> None:
    """One sub-group's optimizer state from the checkpoint, before it is swapped in. In memory: its fp32 weights
    and the saved state. Swapped: the step count, and an unfilled full-size tensor for each state tensor the
    checkpoint holds in a swap file, so that the swapper registers it and reads it from the restored file (a
    fresh optimizer has none, so the files would be ignored and then overwritten). The ZeRO file's copy of such
    a tensor is not used: the serial swapper saves it empty (released after each step), the pipelined one as a
    view of a swap buffer that went back to its pool (pipelined_optimizer_swapper.py, _complete_swap_out)."""
    import torch

    fp32 = optimizer.fp32_partitioned_groups_flat[sub_group]
    base = optimizer.optimizer
    if not swapped:
        fp32.data.copy_(saved["fp32_flat_groups"][sub_group].data)
        base.state[fp32] = {
            key: value.to(fp32.device) if torch.is_tensor(value) else value for key, value in state.items()
        }
        return
    numel = int(optimizer.fp16_partitioned_groups_flat_numel[sub_group])
    current = base.state[fp32]  # the optimizer's state is a defaultdict
    for key, value in state.items():
        if not (torch.is_tensor(value) and value.numel() in (0, numel) and numel > 0):
            current[key] = value.to(fp32.device) if torch.is_tensor(value) else value
        elif key not in current:  # one already there is the swapper's own (this process stepped): it reads it
            current[key] = torch.empty(numel, dtype=value.dtype, device=fp32.device)  # filled by the swap-in
