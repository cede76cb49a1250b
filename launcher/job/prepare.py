"""A training job: from a Plan and the settings to the files every rank reads and the launch command.

`prepare()` checks the NVMe folder the swap files will go to (it exists, is writable and has room), makes the
final ds_config (config/final.py: the user's own merged in, validated) before touching the data, validates the
data (and tokenizes it into OUT/cache when `tokenize`), and builds the (argv, env) for DeepSpeed's launcher.
`write()` puts plan.json, ds_config.json and run_spec.json into OUT. Nothing starts a process here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.config.final import FinalConfig, UserConfig, final_config
from launcher.errors import UserInputError
from launcher.files import folder_bytes, tool_cache_dir, write_json_atomic
from launcher.job import launch, nodes, rundir
from launcher.job.binding import bind_core_list, core_binding
from launcher.job.planning import hostfile_hosts
from launcher.job.preflight import check_nvme_room
from launcher.job.spec import RUN_SPEC_FILE, RunSpec
from launcher.plan.host_buffers import strategy_alloc_conf
from launcher.plan.planner import Plan
from launcher.settings import Settings

if TYPE_CHECKING:
    from launcher.data.rows import Tokenization


@dataclass(frozen=True)
class Job:
    plan: Plan
    spec: RunSpec
    ds_config: dict
    argv: list[str]
    env: dict[str, str]
    n_blocks: int | None  # packed training blocks (None when the data was only inspected)
    identity: dict  # what a checkpoint of this run means (run_identity): compared before a resume
    warnings: tuple[str, ...] = ()  # lint warnings about the user's ds_config
    notes: tuple[str, ...] = ()  # what the launch decided for the user (core binding), one line each

    @property
    def out(self) -> Path:
        return self.spec.out


def model_identity(plan: Plan) -> str:
    """How a run names its model: the absolute folder for local models, the canonical hub id otherwise."""
    if plan.model.source == "local":
        return str(Path(plan.model.config_dir).resolve())
    return plan.model.name


def load_tokenizer(settings: Settings, model_name: str):
    """The tokenizer the ranks will use (--tokenizer, else the model's), with the EOS token packing needs."""
    from transformers import AutoTokenizer

    name = settings.tokenizer or model_name
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=settings.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"cannot load a tokenizer from {name} ({first}); pass --tokenizer ID|DIR") from None
    if tokenizer.eos_token_id is None:
        raise UserInputError(f"the tokenizer from {name} has no EOS token; pass --tokenizer with one")
    return tokenizer


TRAINABLE = ("causal-lm", "seq2seq-lm")  # ModelProfile.kind values the ranks train (rank/trainer.py)


def check_trainable(plan: Plan) -> None:
    """Training runs causal LMs and sequence-to-sequence LMs; any other model is planned but not trained."""
    model = plan.model
    if model.kind not in TRAINABLE:
        raise UserInputError(
            f"{model.name} is a {model.architecture} ({model.model_type}): offload-launch trains causal LMs and "
            "sequence-to-sequence LMs (T5, BART); --dry-run still plans it"
        )


def data_format(settings: Settings) -> str:
    """--data-format, where a --text-field other than "text" says the data is text."""
    if settings.data_format == "auto" and settings.text_field != "text":
        return "text"
    return settings.data_format


def tokenization_for(plan: Plan, settings: Settings, data_kind: str) -> Tokenization:
    """How the records become rows for this model (data/blocks.py): the data's format, and the layout the
    model can train on (packed documents kept apart where its code can, blocks.packs_documents)."""
    from launcher.data.blocks import packing_for, packs_documents
    from launcher.data.formats import check_seq2seq_format, read_chat_template
    from launcher.data.rows import Tokenization

    model = plan.model
    if model.kind == "seq2seq-lm":
        check_seq2seq_format(data_kind)
    packs = model.kind == "causal-lm" and packs_documents(model.model_type, settings.trust_remote_code)
    return Tokenization(
        seq_len=plan.workload.seq_len,
        format=data_kind,
        text_field=settings.text_field,
        packing=packing_for(data_kind, model.kind, packs),
        train_on_prompt=settings.train_on_prompt,
        chat_template=read_chat_template(settings.chat_template) if settings.chat_template else None,
    )


def data_layout(plan: Plan, settings: Settings) -> Tokenization:
    """The data's Tokenization for this model, from a look at the data (and --eval-data, in the same format):
    cheap, no tokenizer; refuses a model that does not train and data it cannot learn from."""
    from launcher.data.sources import inspect_data

    check_trainable(plan)
    source = inspect_data(settings.data, settings.text_field, data_format(settings))
    if settings.eval_data:  # in the training data's format
        inspect_data(settings.eval_data, settings.text_field, source.kind)
    return tokenization_for(plan, settings, source.kind)


def load_data(settings: Settings, tokenization: Tokenization, tokenizer, cache_dir: Path | None):
    """(training rows, held-out rows or None), tokenized once (the ranks reuse the cache in `cache_dir`): proves
    before launch that the data yields rows for this model."""
    from launcher.data.blocks import load_splits

    return load_splits(
        settings.data,
        tokenization,
        tokenizer,
        cache_dir,
        eval_data=settings.eval_data,
        eval_fraction=settings.eval_fraction,
    )


def steps_for_epochs(epochs: float, n_blocks: int, plan: Plan) -> int:
    """Optimizer steps for `epochs` passes: blocks / (world x micro-batch x accumulation), rounded up. In exact
    arithmetic on the decimal the user typed: in floats 1.1 x 100 blocks is 110.00000000000001, one step too many."""
    per_step = plan.world_size * plan.workload.micro_batch * plan.workload.grad_accum
    return max(1, math.ceil(Fraction(str(epochs)) * n_blocks / per_step))


def check_nvme_room_for(plan: Plan, swap: str | None, hostfile: str | None) -> None:
    """The drive under the run's swap folder has room for the plan's NVMe bytes (its own old files count).
    Nothing to check without NVMe offload, or with a hostfile: then the folder is on the other machines."""
    if not swap or hostfile is not None:
        return
    what = "--nvme-path" if plan.workload.nvme_path else f"the NVMe folder (nvme.path in {plan.host.source})"
    check_nvme_room(
        str(Path(swap).parent),
        plan.chosen.memory.nvme_bytes,
        plan.chosen.strategy.label,
        what,
        reusable_bytes=folder_bytes(swap),
    )


def prepare(
    plan: Plan,
    settings: Settings,
    *,
    output_dir: Path,
    user: UserConfig | None = None,
    launcher_args: tuple[str, ...] = (),
    tokenize: bool,
    before_data: Callable[[dict, dict], object] | None = None,
) -> Job:
    """Everything a run needs, checked, with nothing written outside OUT/cache (and that only when `tokenize`).
    `before_data` is called with the run's identity (its data not yet fingerprinted) and the final ds_config
    once everything but the data's tokens is checked and before anything is written: the caller makes the
    checks that need the final config and checks and locks the folder there."""

    if plan.chosen is None:
        raise ValueError("prepare() needs a plan whose strategy fits")
    out = Path(output_dir)
    swap = rundir.run_swap_dir(plan, out)
    node_local = bool(settings.node_local_checkpoints)
    if tokenize:  # a real run
        check_nvme_room_for(plan, swap, settings.hostfile)
    # the final config before the data
    final: FinalConfig = final_config(plan, user, swap_dir=swap, cache_dir=tool_cache_dir(), node_local=node_local)
    tokenization = data_layout(plan, settings)
    pack = tokenize or settings.epochs is not None
    tokenizer = load_tokenizer(settings, model_identity(plan)) if pack else None
    if before_data is not None:
        before_data(run_identity(plan, settings, final.config, None), final.config)
    rows = None
    if pack:
        rows, _ = load_data(settings, tokenization, tokenizer, out / "cache" if tokenize else None)
    if settings.epochs is not None:  # the schedule's length follows the data: the config is made again for it
        steps = steps_for_epochs(settings.epochs, len(rows), plan)
        plan = replace(plan, workload=replace(plan.workload, steps=steps))
        final = final_config(plan, user, swap_dir=swap, cache_dir=tool_cache_dir(), node_local=node_local)
    return assemble(plan, settings, out, final, rows, launcher_args, tokenization)


def assemble(
    plan: Plan,
    settings: Settings,
    out: Path,
    final: FinalConfig,
    rows,
    launcher_args: tuple[str, ...],
    tokenization: Tokenization,
) -> Job:
    """The Job from its checked parts: the run spec, the final config and the launch command. `rows`: the
    training rows (a TokenSet; None when the data was only inspected)."""
    spec = run_spec(plan, settings, out, rundir.run_swap_dir(plan, out), tokenization)
    binding = core_binding(plan, settings, launcher_args)
    argv, env = launch.build_command(launch_spec(plan, settings, out, launcher_args, bind_cores=binding.bind))
    identity = run_identity(plan, settings, final.config, rows)
    n_blocks = None if rows is None else len(rows)
    notes = () if binding.note is None else (binding.note,)
    return Job(plan, spec, final.config, argv, env, n_blocks, identity, final.warnings, notes)


def run_identity(plan: Plan, settings: Settings, ds_config: dict, rows) -> dict:
    """What a checkpoint of this run means, for the resume check (resume.resume_changes): the model's shape,
    the packed data's fingerprint (None when the data was not tokenized), the workload as DeepSpeed runs it
    (from the final ds_config, so a --ds-config's own values count), the strategy, the seed and the steps."""
    zero = ds_config.get("zero_optimization", {})
    scheduler = json.loads(json.dumps(ds_config.get("scheduler"))) if ds_config.get("scheduler") else None
    if scheduler:  # its length follows --steps, which may grow on a resume (stated, not refused)
        scheduler.get("params", {}).pop("total_num_steps", None)
    model = plan.model
    precision = next((p for p in ("bf16", "fp16") if ds_config.get(p, {}).get("enabled")), "fp32")
    return {
        "model": model_identity(plan),
        "model_shape": {
            "architecture": model.architecture,
            "params": model.params - model.trainable_params,  # the base's: an adapter is "lora" below
            "layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "vocab_size": model.vocab_size,
        },
        "data_path": str(Path(settings.data).resolve()),
        "data": None if rows is None else {"blocks": len(rows), "sha256": rows.digest()},
        "seq_len": plan.workload.seq_len,
        "micro_batch": ds_config["train_micro_batch_size_per_gpu"],
        "grad_accum": ds_config["gradient_accumulation_steps"],
        "world_size": plan.world_size,
        "zero_stage": zero.get("stage", 0),
        "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none"),
        "offload_param": zero.get("offload_param", {}).get("device", "none"),
        "precision": precision,
        "optimizer": ds_config.get("optimizer"),
        "schedule": scheduler,
        "seed": settings.seed,
        "lora": plan.lora.to_json() if plan.lora else None,
        "checkpoints": rundir.node_local_root(settings.node_local_checkpoints, rundir.output_dir_of(settings))
        or rundir.SHARED_CHECKPOINTS,
        # with --epochs the steps follow the data: unknown until it is tokenized
        "steps": None if settings.epochs is not None and rows is None else plan.workload.steps,
    }


def run_spec(plan: Plan, settings: Settings, out: Path, swap: str | None, tokenization: Tokenization) -> RunSpec:
    """What every rank reads: paths, steps, seed, and the plan's predictions to compare with."""
    memory = plan.chosen.memory
    return RunSpec(
        output_dir=str(out.resolve()),
        model=model_identity(plan),
        tokenizer=settings.tokenizer,
        data=str(Path(settings.data).resolve()),
        tokenization=asdict(tokenization),
        model_kind=plan.model.kind,
        eval_data=str(Path(settings.eval_data).resolve()) if settings.eval_data else None,
        eval_fraction=settings.eval_fraction,
        eval_every=settings.eval_every,
        seq_len=plan.workload.seq_len,
        steps=plan.workload.steps,
        seed=settings.seed,
        save_every=settings.save_every,
        keep_checkpoints=settings.keep_checkpoints,
        node_local_checkpoints=rundir.node_local_root(settings.node_local_checkpoints, out),
        resume=settings.resume,
        trust_remote_code=settings.trust_remote_code,
        activation_checkpointing=plan.workload.activation_checkpointing,
        offload_activations=plan.chosen.strategy.offload_activations == "cpu",
        nvme_swap_dir=swap,
        lora=plan.lora.to_json() if plan.lora else None,
        merge=plan.workload.merge,
        predicted={
            "step_seconds": plan.chosen.timing.step_seconds,
            "calibrated_step_seconds": plan.chosen.timing.calibrated_step_seconds,  # None: no finished runs
            "passes_seconds": plan.chosen.timing.passes_seconds,
            "update_seconds": plan.chosen.timing.update_seconds,
            "tokens_per_s": plan.chosen.timing.tokens_per_s,
            "gpu_bytes_per_device": memory.gpu_bytes_per_device,
            "cpu_bytes_per_node": memory.cpu_bytes,
            "nvme_bytes_per_node": memory.nvme_bytes,
            "step_terms": plan.chosen.timing.to_json(),  # every term of the step-time model
            "rate_sources": dict(plan.rates.sources),  # where each rate it ran on came from
        },
    )


def launch_spec(
    plan: Plan, settings: Settings, out: Path, launcher_args: tuple[str, ...], *, bind_cores: bool | None = None
) -> launch.LaunchSpec:
    """How DeepSpeed's launcher starts the ranks (`bind_cores`: core_binding's decision; None: the settings' as
    typed, off by default). On one CUDA node probed live, the GPUs CUDA_VISIBLE_DEVICES
    selects are named (--include): DeepSpeed's --num_gpus would put the ranks on GPUs 0..N-1 whatever it says.
    A described host (--host-spec, plan.host.source is its file) is another machine: this machine's selection
    says nothing about its GPUs, so it is not applied (nor refused) there. The ranks' PYTORCH_ALLOC_CONF is the
    plan's (Plan.alloc_conf), the setting its CPU estimate counted."""

    from launcher.inspection.cuda_devices import VISIBLE_DEVICES_ENV, launch_devices, rank_devices

    devices = None
    if plan.host.accelerator == "cuda" and plan.host.source == "live" and not settings.hostfile:
        devices = launch_devices(os.environ.get(VISIBLE_DEVICES_ENV), plan.ranks_per_node)
    # Several machines: the rendezvous is the hostfile's first host unless --master-addr says otherwise, rather
    # than DeepSpeed's default, the first address `ssh HOST hostname -I` prints (a container bridge's, often)
    master_addr = settings.master_addr
    if settings.hostfile and not master_addr:
        master_addr = hostfile_hosts(settings.hostfile)[0]
    return launch.LaunchSpec(
        run_spec_path=str(out.resolve() / RUN_SPEC_FILE),
        ranks_per_node=plan.ranks_per_node,
        accelerator=plan.host.accelerator,
        cpu_cores=plan.host.cpu_cores,
        master_port=settings.master_port or launch.free_port(),
        hostfile=settings.hostfile,
        launcher=settings.launcher,
        master_addr=master_addr,
        bind_cores=(bind := bool(settings.bind_cores) if bind_cores is None else bind_cores),
        bind_core_list=bind_core_list(plan, settings, launcher_args) if bind else None,
        extra_args=launcher_args,
        devices=None if devices is None else devices[0],
        pci_bus_order=devices is not None and devices[1],
        rank_devices=None if devices is None else rank_devices(os.environ.get(VISIBLE_DEVICES_ENV)),
        alloc_conf=strategy_alloc_conf(plan.alloc_conf, plan.chosen.strategy),
        env_file=str(out.resolve() / nodes.ENV_FILE) if settings.hostfile else None,
    )


def write(job: Job) -> None:
    out = job.out
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "plan.json", job.plan.to_json(job.ds_config))
    write_json_atomic(out / "ds_config.json", job.ds_config)
    job.spec.dump(out / RUN_SPEC_FILE)
    if "DS_ENV_FILE" in job.env:
        nodes.write_env_file(Path(job.env["DS_ENV_FILE"]), job.env)
    if job.spec.nvme_swap_dir:
        Path(job.spec.nvme_swap_dir).mkdir(parents=True, exist_ok=True)
