"""A training job: from a Plan and the run options to the files every rank reads and the launch command.

`prepare()` checks the NVMe folder the swap files will go to (it exists, is writable and has room), validates
the data (and tokenizes it into OUT/cache when `tokenize`), renders and validates the ds_config for this
run's own NVMe folder, and builds the (argv, env) for DeepSpeed's launcher.
`write()` puts plan.json, ds_config.json and run_spec.json into OUT. Nothing starts a process here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.config import dsconfig
from launcher.errors import UserInputError
from launcher.files import folder_bytes, write_json_atomic
from launcher.inspection.host import check_nvme_room
from launcher.job import launch, rundir
from launcher.job.spec import RunSpec
from launcher.plan.planner import Plan
from launcher.views import plan_view as report


@dataclass(frozen=True)
class JobOptions:
    data: str
    output_dir: str
    text_field: str = "text"
    tokenizer: str | None = None
    epochs: float | None = None
    save_every: int = 0
    keep_checkpoints: int = 2
    resume: bool = True
    seed: int = 0
    trust_remote_code: bool = False
    hostfile: str | None = None
    launcher: str = "pdsh"
    master_addr: str | None = None
    master_port: int | None = None
    bind_cores: bool = False
    launcher_args: tuple[str, ...] = ()
    user_config: dict | None = None  # --ds-config: the user's ds_config, merged over the generated one

    def __post_init__(self) -> None:
        if self.save_every < 0:
            raise UserInputError(f"--save-every must not be negative, got {self.save_every}")
        if self.keep_checkpoints < 1:
            raise UserInputError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.epochs is not None and not self.epochs > 0:
            raise UserInputError(f"--epochs must be positive, got {self.epochs}")


@dataclass(frozen=True)
class Job:
    plan: Plan
    spec: RunSpec
    ds_config: dict
    argv: list[str]
    env: dict[str, str]
    n_blocks: int | None  # packed training blocks (None when the data was only inspected)


def model_identity(plan: Plan) -> str:
    """How a run names its model: the absolute folder for local models, the canonical hub id otherwise."""
    if plan.model.source == "local":
        return str(Path(plan.model.config_dir).resolve())
    return plan.model.name


def load_blocks(opts: JobOptions, model_name: str, seq_len: int, cache_dir: Path | None):
    """Tokenize and pack the data once (ranks reuse the cache): proves before launch that it yields tokens."""
    from transformers import AutoTokenizer

    from launcher.data.sources import inspect_data, load_token_blocks

    source = inspect_data(opts.data, opts.text_field)
    name = opts.tokenizer or model_name
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=opts.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"cannot load a tokenizer from {name} ({first}); pass --tokenizer ID|DIR") from None
    if tokenizer.eos_token_id is None:
        raise UserInputError(f"the tokenizer from {name} has no EOS token; pass --tokenizer with one")
    return load_token_blocks(source, tokenizer, seq_len, opts.text_field, cache_dir)


def steps_for_epochs(epochs: float, n_blocks: int, plan: Plan) -> int:
    """Optimizer steps for `epochs` passes: blocks / (world x micro-batch x accumulation), rounded up."""
    per_step = plan.world_size * plan.workload.micro_batch * plan.workload.grad_accum
    return max(1, math.ceil(epochs * n_blocks / per_step))


def prepare(plan: Plan, opts: JobOptions, *, tokenize: bool, cache_dir: Path | None = None) -> Job:
    if plan.chosen is None:
        raise ValueError("prepare() needs a plan whose strategy fits")
    out = Path(opts.output_dir)
    model_dir = model_identity(plan)
    strategy = plan.chosen.strategy
    swap = rundir.run_swap_dir(plan, out)
    if swap and tokenize and opts.hostfile is None:  # a real run on this machine (several: the folder is theirs)
        swap_root = str(Path(swap).parent)
        what = "--nvme-path" if plan.workload.nvme_path else f"the NVMe folder (nvme.path in {plan.host.source})"
        reusable = folder_bytes(swap)
        check_nvme_room(swap_root, plan.chosen.memory.nvme_bytes, strategy.label, what, reusable_bytes=reusable)
    n_blocks = None
    if tokenize or opts.epochs is not None:
        blocks = load_blocks(opts, model_dir, plan.workload.seq_len, out / "cache" if tokenize else None)
        n_blocks = len(blocks)
    else:
        from launcher.data.sources import inspect_data

        inspect_data(opts.data, opts.text_field)
    if opts.epochs is not None:
        plan = replace(plan, workload=replace(plan.workload, steps=steps_for_epochs(opts.epochs, n_blocks, plan)))

    ds_config = dsconfig.render(plan, nvme_path=swap)
    if opts.user_config is not None:
        from launcher.config import lint

        ds_config, _warnings = lint.apply_user_config(opts.user_config, ds_config, plan)  # cli.train printed them
        for section in ("offload_optimizer", "offload_param"):  # the user's nvme_path is the drive; the run
            offload = ds_config.get("zero_optimization", {}).get(section, {})  # swaps into its own folder on it
            if swap and offload.get("device") == "nvme":
                offload["nvme_path"] = swap
    dsconfig.validate(ds_config, plan.world_size, cache_dir=cache_dir)

    memory = plan.chosen.memory
    spec = RunSpec(
        output_dir=str(out.resolve()),
        model=model_dir,
        tokenizer=opts.tokenizer,
        data=str(Path(opts.data).resolve()),
        text_field=opts.text_field,
        seq_len=plan.workload.seq_len,
        steps=plan.workload.steps,
        seed=opts.seed,
        save_every=opts.save_every,
        keep_checkpoints=opts.keep_checkpoints,
        resume=opts.resume,
        trust_remote_code=opts.trust_remote_code,
        activation_checkpointing=plan.workload.activation_checkpointing,
        nvme_swap_dir=swap,
        predicted={
            "step_seconds": plan.chosen.timing.step_seconds,
            "tokens_per_s": plan.chosen.timing.tokens_per_s,
            "gpu_bytes_per_device": memory.gpu_bytes_per_device,
            "cpu_bytes_per_node": memory.cpu_bytes,
            "nvme_bytes_per_node": memory.nvme_bytes,
        },
    )
    launch_spec = launch.LaunchSpec(
        run_spec_path=str(out.resolve() / "run_spec.json"),
        ranks_per_node=plan.ranks_per_node,
        accelerator=plan.host.accelerator,
        cpu_cores=plan.host.cpu_cores,
        master_port=opts.master_port or launch.free_port(),
        hostfile=opts.hostfile,
        launcher=opts.launcher,
        master_addr=opts.master_addr,
        bind_cores=opts.bind_cores,
        extra_args=opts.launcher_args,
    )
    argv, env = launch.build_command(launch_spec)
    return Job(plan, spec, ds_config, argv, env, n_blocks)


def write(job: Job) -> None:
    out = Path(job.spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "plan.json", report.plan_json(job.plan, job.ds_config))
    write_json_atomic(out / "ds_config.json", job.ds_config)
    job.spec.dump(out / "run_spec.json")
    if job.spec.nvme_swap_dir:
        Path(job.spec.nvme_swap_dir).mkdir(parents=True, exist_ok=True)
