"""The run spec: the contract between the `offload-launch` process and the training ranks.

The CLI side (`launcher.job.prepare`) writes OUT/run_spec.json; every rank (`launcher.rank`) reads it. It
holds paths, steps and seeds, never a plan: the ranks know nothing about planning, so a user can also start
them under their own launcher with a run_spec.json of their own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.files import write_json_atomic

RUN_SPEC_FILE = "run_spec.json"
WARMUP_STEPS_EXCLUDED = 1  # the first optimizer step pays JIT/allocator warm-up; medians skip it


@dataclass(frozen=True)
class RunSpec:
    output_dir: str
    model: str
    data: str
    seq_len: int
    steps: int
    tokenizer: str | None = None
    tokenization: dict | None = None  # data/blocks.Tokenization's fields (None: text, streamed as it comes)
    model_kind: str = "causal-lm"  # inspection ModelProfile.kind: causal-lm or seq2seq-lm
    eval_data: str | None = None  # held-out data (else eval_fraction of the rows, else no eval loss)
    eval_fraction: float | None = None
    eval_every: int = 0  # eval loss every N steps (0: at each checkpoint) and at the end
    seed: int = 0
    save_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    # --node-local-checkpoints: this run's folder on every node's own disk (the same path on each); each node keeps
    # its ranks' checkpoints in node<N> under it. None: OUT/checkpoints, shared by every node.
    node_local_checkpoints: str | None = None
    resume: bool = True
    trust_remote_code: bool = False
    activation_checkpointing: bool = True
    offload_activations: bool = False  # the saved activations in CPU memory (torch.autograd.graph.save_on_cpu)
    nvme_swap_dir: str | None = None  # this run's own folder under --nvme-path, removed at the end
    # the LoRA adapter to train (plan/adapters.Lora.to_json: rank, alpha, dropout, targets); None: every weight trains
    lora: dict | None = None
    merge: bool = False  # with a LoRA: also OUT/final-merged, the base with the adapter merged in
    smoke: bool = False  # run the smoke checks (launcher/rank/smoke_checks.py) instead of a training run
    smoke_memory_tolerance: float = 1.25  # largest measured / predicted memory the smoke check accepts
    predicted: dict = field(default_factory=dict)  # the plan's figures, written next to the measured ones

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls(**json.loads(Path(path).read_text()))

    def dump(self, path: str | Path) -> None:
        write_json_atomic(Path(path), asdict(self))

    def rows_layout(self):
        """The data's Tokenization (data/blocks.py), as the CLI tokenized it into OUT/cache."""
        from launcher.data.rows import Tokenization

        return Tokenization(**(self.tokenization or {"seq_len": self.seq_len}))

    @property
    def evaluates(self) -> bool:
        return self.eval_data is not None or self.eval_fraction is not None

    @property
    def out(self) -> Path:
        return Path(self.output_dir)

    @property
    def checkpoint_dir(self) -> Path:
        """Where this rank's checkpoints go: OUT/checkpoints, or its node's folder of node-local storage."""
        if self.node_local_checkpoints:
            return Path(self.node_local_checkpoints) / f"node{node_rank()}"
        return self.out / "checkpoints"


def node_rank() -> int:
    """This rank's node, numbered in the hostfile's order: DeepSpeed's launch.py sets CROSS_RANK (and the Slurm
    entry, launcher/job/sbatch.py, from SLURM_NODEID); torchrun sets GROUP_RANK."""
    return int(os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", "0")))
