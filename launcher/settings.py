"""Every setting of offload-launch, declared once.

Each field of `Settings` is one setting: its Python type, its default, and the `Declaration` it carries (help
text, flag, choices, bounds, recipe key). Everything else is derived from these declarations:
- the Click options of `run` and `check` (launcher/cli/options.py),
- the keys a recipe may set (launcher/recipes.py reads `recipe_keys()`),
- the options table in docs/options.md (launcher/views/options_table.py; `make docs` writes it and
  tests/test_settings.py keeps it in sync),
- validation: per-setting bounds and choices, then the cross-field rules (`validate()`), with one message
  per problem naming the flag.

The layering is one function, `layer()`: defaults < recipe < mode defaults (smoke) < the user's
ds_config pins < what the user typed. Adding a knob is one field here plus its use.

Leaf module: no Click, no torch, nothing heavy, so every part of the tool can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from launcher.errors import UserInputError

OFFLOAD_DEVICES = ("auto", "none", "cpu", "nvme")
PRECISIONS = ("auto", "bf16", "fp16")
ZERO_STAGES = ("auto", "1", "2", "3")
MULTINODE_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm")
OPTIMIZER_STATES = ("fp32", "bf16")
# What --lora changes of the defaults: a LoRA learns at a higher rate than full fine-tuning (Dettmers et al. 2023,
# "QLoRA", Appendix B.2: lr 2e-4 for the 7B and 13B models; peft's and LLaMA-Factory's LoRA examples use 1e-4 to
# 2e-4), so its default is 2e-4 unless --lr is typed or a recipe sets it.
LORA_MODE_DEFAULTS = {"lr": 2e-4}
ADAPTER_EXTRAS_MISSING = "--lora trains with peft, which is not installed: pip install 'offload-launch[adapters]'"
DATA_FORMATS = ("auto", "chat", "instruction", "prompt", "pairs", "text")  # launcher/data/formats.py FORMATS


class Group(str, Enum):
    """Where a setting belongs; also the section it is listed under in docs/options.md."""

    PLAN = "plan"  # inputs to the plan (model, host, strategy pins, workload)
    TRAIN = "train"  # a training run (data, run folder, checkpoints, launch)
    OUTPUT = "output"  # what `run` prints or writes without changing the plan
    SMOKE = "smoke"  # --smoke mode


class Kind(str, Enum):
    """How a recipe value is read (launcher/recipes.py): relative to the recipe file, a hub id, a host."""

    PLAIN = "plain"
    PATH = "path"  # relative to the recipe file; `package:` inside the installed package
    MODEL = "model"  # a folder when one exists (or starts with ./ ../ / ~ package:), else a hub id
    HOST = "host"  # a described host's name, a file, or `this`


@dataclass(frozen=True)
class Declaration:
    """One setting as the rest of the tool sees it: what `setting()` declared, completed from the field
    (name, type, default) by `_declare()`."""

    help: str
    group: Group
    flag: str | None = None  # default: --name-with-dashes
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # validate(): value >= minimum
    positive: bool = False  # validate(): value > 0
    recipe_key: str | None = ""  # "" until declared: the field's name; None: command line only
    kind: Kind = Kind.PLAIN
    negatable: bool | None = None  # a boolean with a --no- twin (default: when it defaults to True)
    file: bool = False  # a path Click checks is not a folder
    show_default: bool = True
    name: str = ""
    type: type = str  # int, float, bool or str (None-able settings are Optional of it)
    default: object = None

    @property
    def flags(self) -> str:
        """As written on the command line: '--resume/--no-resume', '--force', '--seq-len'."""
        return f"{self.flag}/--no-{self.flag[2:]}" if self.negatable else self.flag


def setting(default: object, help: str, *, group: Group, recipe: str | bool = True, **declared) -> object:
    """One setting's declaration: a dataclass field carrying its Declaration. recipe: True (the key is the
    field's name), another key name, or False (command line only); `declared`: Declaration's other fields."""
    key = None if recipe is False else ("" if recipe is True else recipe)
    return field(default=default, metadata={"declaration": Declaration(help, group, recipe_key=key, **declared)})


@dataclass(frozen=True)
class Settings:
    """One run's settings after layering. Constructing it validates it."""

    # --- plan: the model and the host
    model: str | None = setting(
        None,
        "Hugging Face hub id (e.g. meta-llama/Llama-2-7b) or a local directory with config.json.",
        group=Group.PLAN,
        metavar="ID|DIR",
        kind=Kind.MODEL,
    )
    recipe: str | None = setting(
        None,
        "Start from a recipe (offload-launch recipes lists them); options you type override it.",
        group=Group.PLAN,
        metavar="NAME|FILE",
        recipe=False,
    )
    trust_remote_code: bool = setting(False, "Allow model code shipped with the checkpoint.", group=Group.PLAN)
    ds_config: str | None = setting(
        None,
        'Your ds_config as the base: your values win, "auto" values are filled from the plan, and the merged '
        "result is linted and validated like a generated one. Its ZeRO stage, offload devices, micro-batch and "
        "accumulation pin the plan.",
        group=Group.PLAN,
        metavar="FILE",
        recipe=False,
        file=True,
    )
    host_spec: str | None = setting(
        None,
        "Plan for a described host instead of probing this machine: a name from recipes/hosts "
        "(e.g. 1x-a100-80g), a YAML/JSON file, or 'this'.",
        group=Group.PLAN,
        metavar="NAME|FILE",
        recipe="host",
        kind=Kind.HOST,
        file=True,
    )
    nvme_path: str | None = setting(
        None, "Folder on a local NVMe drive for ZeRO-Infinity swap files.", group=Group.PLAN, metavar="DIR"
    )
    num_gpus: int | None = setting(
        None, "Ranks per node (default: every GPU; 1 on a CPU-only host).", group=Group.PLAN, minimum=1
    )
    # --- plan: the strategy, pinned or chosen
    zero_stage: str = setting("auto", "Pin the ZeRO stage.", group=Group.PLAN, choices=ZERO_STAGES)
    offload_optimizer: str = setting(
        "auto", "Pin where the optimizer states and the Adam step live.", group=Group.PLAN, choices=OFFLOAD_DEVICES
    )
    offload_param: str = setting(
        "auto",
        "Pin where the 16-bit parameters live (cpu/nvme need ZeRO-3).",
        group=Group.PLAN,
        choices=OFFLOAD_DEVICES,
    )
    offload_ratio: float | None = setting(
        None,
        "Pin the share of the optimizer states offloaded with ZeRO-3 (DeepSpeed's offload_optimizer.ratio): "
        "1 offloads them all, 0.6 keeps 40 % and their Adam step on the GPU [default: the plan chooses].",
        group=Group.PLAN,
        metavar="X",
    )
    optimizer_states: str = setting(
        "fp32",
        "Precision of the offloaded optimizer states: bf16 keeps Adam's master weights and moments in 16 bits "
        "(DeepSpeed >= 0.19.1, optimizer on the CPU, bf16 training): 6 instead of 12 B/param on the CPU, "
        "different numerics.",
        group=Group.PLAN,
        choices=OPTIMIZER_STATES,
    )
    zenflow: bool = setting(
        False,
        "Stall-free offloading (DeepSpeed ZenFlow, DeepSpeed >= 0.18.0, optimizer on the CPU): the top 10 % of "
        "gradient columns by importance update on the GPU every step, the rest accumulate and update on the CPU, "
        "asynchronously, every --zenflow-interval steps. It changes when parameters are updated, so it is opt-in.",
        group=Group.PLAN,
    )
    zenflow_interval: int = setting(
        4,
        "With --zenflow: steps between the CPU's updates of the other gradients (ZenFlow's update_interval; it "
        "reselects the important columns as often).",
        group=Group.PLAN,
        minimum=1,
        metavar="N",
    )
    offload_activations: str = setting(
        "auto",
        "Pin where the checkpointed activations wait for the backward: cpu keeps them in pinned CPU memory "
        "(torch.autograd.graph.save_on_cpu), copied over PCIe both ways [default: cpu only when the GPU has no room "
        "for them].",
        group=Group.PLAN,
        choices=("auto", "none", "cpu"),
    )
    # --- plan: the workload
    seq_len: int | None = setting(
        None, "Tokens per sequence [default: model maximum, at most 2048].", group=Group.PLAN, minimum=1
    )
    allow_long_seq: bool = setting(False, "Allow --seq-len above the model's max positions.", group=Group.PLAN)
    micro_batch: int = setting(1, "Sequences per rank per step.", group=Group.PLAN, minimum=1)
    grad_accum: int = setting(1, "Micro-batches accumulated per optimizer step.", group=Group.PLAN, minimum=1)
    precision: str = setting(
        "auto",
        "16-bit format (auto: bf16 where the GPU has it, compute capability >= 8.0; else fp16).",
        group=Group.PLAN,
        choices=PRECISIONS,
    )
    activation_checkpointing: bool = setting(
        True, "Recompute activations in backward to save memory.", group=Group.PLAN
    )
    lora: bool = setting(
        False,
        "Train a LoRA adapter (peft) instead of every weight: the base stays frozen in 16-bit, only the adapter's "
        "r·(in + out) parameters per adapted layer get gradients and Adam states (needs "
        "pip install 'offload-launch[adapters]'). It changes what is learned, so it is only ever your choice.",
        group=Group.PLAN,
    )
    lora_rank: int = setting(8, "With --lora: the adapter's rank r.", group=Group.PLAN, minimum=1, metavar="R")
    lora_alpha: float | None = setting(
        None,
        "With --lora: the adapter's alpha (its output is scaled by alpha / r) [default: 2 x --lora-rank].",
        group=Group.PLAN,
        positive=True,
        metavar="A",
    )
    lora_dropout: float = setting(
        0.0, "With --lora: dropout on the adapter's input (0 <= P < 1).", group=Group.PLAN, minimum=0, metavar="P"
    )
    lora_target: str = setting(
        "auto",
        "With --lora: the linear layers to adapt, by name (comma-separated, e.g. q_proj,v_proj), or all-linear "
        "(every one but the output embedding) [default auto: peft's choice for the model's family, else "
        "all-linear].",
        group=Group.PLAN,
        metavar="NAMES",
    )
    merge: bool = setting(
        False,
        "With --lora: also write OUT/final-merged, the base with the adapter merged in (a whole model that loads "
        "without peft; rank 0 rebuilds it in CPU RAM after training, which the plan counts).",
        group=Group.PLAN,
    )
    lr: float = setting(2e-5, "Peak learning rate.", group=Group.PLAN, positive=True)
    warmup_steps: int = setting(10, "Linear warm-up steps.", group=Group.PLAN, minimum=0)
    steps: int = setting(100, "Optimizer steps.", group=Group.PLAN, minimum=1)
    # --- a training run
    data: str | None = setting(
        None,
        "Training data: a datasets save_to_disk folder, or .jsonl/.json/.txt/.parquet/.csv files.",
        group=Group.TRAIN,
        metavar="PATH",
        kind=Kind.PATH,
    )
    text_field: str = setting("text", "Field holding the text.", group=Group.TRAIN)
    data_format: str = setting(
        "auto",
        "What the records hold: chat (messages), instruction (instruction, input, output), prompt (prompt, "
        "completion), pairs (source, target or input, output), text [default: told from the fields].",
        group=Group.TRAIN,
        choices=DATA_FORMATS,
    )
    chat_template: str | None = setting(
        None,
        "A Jinja chat template to render 'messages' with, replacing the tokenizer's (or where it has none).",
        group=Group.TRAIN,
        metavar="FILE",
        kind=Kind.PATH,
        file=True,
    )
    train_on_prompt: bool = setting(
        False,
        "Put loss on the prompts of chat, instruction and prompt data too [default: only on the responses].",
        group=Group.TRAIN,
    )
    eval_data: str | None = setting(
        None,
        "Held-out data in the training data's format: its loss is computed every --eval-every steps and at the end.",
        group=Group.TRAIN,
        metavar="PATH",
        kind=Kind.PATH,
    )
    eval_fraction: float | None = setting(
        None,
        "Hold out this share of the training data's rows (0 < F < 1) for an eval loss instead of --eval-data.",
        group=Group.TRAIN,
        metavar="F",
        positive=True,
    )
    eval_every: int = setting(
        0,
        "With --eval-data or --eval-fraction: eval loss every N optimizer steps (0: at each checkpoint) and at the "
        "end.",
        group=Group.TRAIN,
        minimum=0,
    )
    tokenizer: str | None = setting(
        None, "Tokenizer source when the model folder has none.", group=Group.TRAIN, metavar="ID|DIR", kind=Kind.MODEL
    )
    output_dir: str | None = setting(None, "Run folder [default: runs/<model name>].", group=Group.TRAIN, metavar="DIR")
    epochs: float | None = setting(None, "Passes over the data (overrides --steps).", group=Group.TRAIN, positive=True)
    save_every: int = setting(
        0, "Checkpoint every N optimizer steps (0: only at the end).", group=Group.TRAIN, minimum=0
    )
    keep_checkpoints: int = setting(2, "Complete checkpoints to keep.", group=Group.TRAIN, minimum=1)
    node_local_checkpoints: str | None = setting(
        None,
        "Checkpoints on each node's own disk at DIR (the same path on every node) instead of OUT/checkpoints: each "
        "node keeps its ranks' shards (DeepSpeed's use_node_local_storage); a resume needs every node's folder.",
        group=Group.TRAIN,
        metavar="DIR",
        kind=Kind.PATH,
    )
    resume: bool = setting(
        True,
        "Continue from the newest complete checkpoint in --output-dir, or start over.",
        group=Group.TRAIN,
    )
    seed: int = setting(0, "Seed for data order and init.", group=Group.TRAIN)
    force: bool = setting(False, "Reuse an --output-dir that holds a different run.", group=Group.TRAIN, recipe=False)
    hostfile: str | None = setting(
        None,
        "DeepSpeed hostfile ('host slots=N' per line) for several machines.",
        group=Group.TRAIN,
        metavar="FILE",
        kind=Kind.PATH,
        file=True,
    )
    launcher: str = setting(
        "pdsh", "How DeepSpeed reaches the other machines.", group=Group.TRAIN, choices=MULTINODE_LAUNCHERS
    )
    master_addr: str | None = setting(None, "Address of the rank-0 machine (multi-node).", group=Group.TRAIN)
    master_port: int | None = setting(None, "Rendezvous port [default: a free port].", group=Group.TRAIN)
    bind_cores: bool | None = setting(
        None,
        "Pin each rank to its share of cores (DeepSpeed --bind_cores_to_rank, needs numactl) [default: on when the"
        " optimizer is offloaded and numactl is installed].",
        group=Group.TRAIN,
        negatable=True,
        show_default=False,
    )
    sbatch: str | None = setting(
        None,
        "Write a Slurm batch script for this run to FILE and exit, starting nothing: the plan's nodes, tasks and GPUs "
        "per node, DeepSpeed's hostfile and the rendezvous from the allocation, and this command (docs/slurm.md).",
        group=Group.TRAIN,
        metavar="FILE",
        recipe=False,
        file=True,
    )
    # --- what `run` prints or writes
    dry_run: bool = setting(
        False,
        "Print the plan, the ds_config and the launch command; start nothing.",
        group=Group.OUTPUT,
        recipe=False,
    )
    json: bool = setting(
        False,
        "Print exactly one JSON object (docs/json.md).",
        group=Group.OUTPUT,
        recipe=False,
    )
    config_out: str | None = setting(
        None, "Write the ds_config to PATH.", group=Group.OUTPUT, metavar="PATH", recipe=False, file=True
    )
    # --- --smoke
    smoke: bool = setting(
        False,
        "Check the configuration in minutes instead of training: a few steps (--steps, default 3) and named "
        "checks (config, data, engine, loss, memory, checkpoint, NVMe clean-up); exit 10-18 names the failed one.",
        group=Group.SMOKE,
        recipe=False,
    )
    smoke_layers: int | None = setting(
        None,
        "With --smoke: keep the real shapes but only K transformer layers, random weights.",
        group=Group.SMOKE,
        metavar="K",
        minimum=1,
        recipe=False,
    )
    smoke_timeout: float = setting(
        15.0,
        "With --smoke: fail (exit 17) instead of hanging past this many minutes.",
        group=Group.SMOKE,
        metavar="MINUTES",
        positive=True,
        recipe=False,
    )
    smoke_memory_tolerance: float = setting(
        1.25,
        "With --smoke: the largest measured / predicted peak memory per tier the memory check accepts.",
        group=Group.SMOKE,
        metavar="RATIO",
        positive=True,
        recipe=False,
    )
    junit_xml: str | None = setting(
        None,
        "With --smoke: also write the checks as JUnit XML (one test case per check) for CI.",
        group=Group.SMOKE,
        metavar="PATH",
        recipe=False,
        file=True,
    )

    # Not a setting: the names the user typed on the command line (layer() fills it). Modes consult it, e.g.
    # --smoke picks its learning rate by the model's width unless --lr was typed.
    typed: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        validate({name: getattr(self, name) for name in DECLARATIONS})


# ------------------------------------------------------------------------------------------ declarations


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _base_type(annotation: str) -> type:
    return _TYPES[annotation.split("|")[0].strip()]


def _declare(f: dataclasses.Field) -> Declaration:
    declared: Declaration = f.metadata["declaration"]
    base = _base_type(f.type)
    return dataclasses.replace(
        declared,
        name=f.name,
        type=base,
        default=f.default,
        flag=declared.flag or "--" + f.name.replace("_", "-"),
        recipe_key=f.name if declared.recipe_key == "" else declared.recipe_key,
        negatable=declared.negatable if declared.negatable is not None else (base is bool and f.default is True),
    )


DECLARATIONS: dict[str, Declaration] = {f.name: _declare(f) for f in dataclasses.fields(Settings) if f.metadata}


def declaration(name: str) -> Declaration:
    return DECLARATIONS[name]


def recipe_keys() -> dict[str, Declaration]:
    """Recipe key -> the setting it sets (a recipe writes `host:` for --host-spec, `model:` for --model)."""
    return {d.recipe_key: d for d in DECLARATIONS.values() if d.recipe_key}


def defaults() -> dict[str, object]:
    return {name: d.default for name, d in DECLARATIONS.items()}


# ------------------------------------------------------------------------------------------ validation


def _bound_problem(d: Declaration, value: object) -> str | None:
    if value is None or d.type not in (int, float) or isinstance(value, bool):
        return None
    if d.minimum is not None and value < d.minimum:
        bound = "must not be negative" if d.minimum == 0 else f"must be at least {d.minimum:g}"
        return f"{d.flag} {bound}, got {value}"
    if d.positive and not value > 0:
        return f"{d.flag} must be positive, got {value}"
    return None


def _choice_problem(d: Declaration, value: object) -> str | None:
    if d.choices and value is not None and str(value) not in d.choices:
        return f"{d.flag} must be one of {', '.join(d.choices)}, got {value}"
    return None


def _offload_needs_zero3(values: Mapping[str, object]) -> str | None:
    """Parameters are only partitioned, so only offloadable, at ZeRO stage 3 (DeepSpeed's offload_param)."""
    stage, param = values.get("zero_stage"), values.get("offload_param")
    if stage in ("1", "2") and param in ("cpu", "nvme"):
        return (
            f"--offload-param {param} needs ZeRO-3 (parameters are only partitioned at stage 3); "
            f"drop --zero-stage {stage} or use --offload-param none"
        )
    return None


def _nvme_optimizer_needs_zero3(values: Mapping[str, object]) -> str | None:
    """DeepSpeed swaps optimizer states to NVMe only in ZeRO-3 (stage3.py's optimizer swapper)."""
    stage = values.get("zero_stage")
    if stage in ("1", "2") and values.get("offload_optimizer") == "nvme":
        return (
            f"--offload-optimizer nvme is supported by DeepSpeed with ZeRO-3 only; drop --zero-stage "
            f"{stage} or use --offload-optimizer cpu"
        )
    return None


def _offload_ratio_range(values: Mapping[str, object]) -> str | None:
    """DeepSpeed's offload_optimizer.ratio is a share: 0 <= ratio <= 1 (offload_config.py Field(ge=0, le=1)); 0
    offloads nothing, so it is --offload-optimizer none, not a ratio."""
    ratio = values.get("offload_ratio")
    if ratio is not None and not 0 < ratio <= 1:
        return f"--offload-ratio must be above 0 and at most 1, got {ratio:g} (0: use --offload-optimizer none)"
    return None


def _partial_offload_needs_zero3_cpu(values: Mapping[str, object]) -> str | None:
    """A ratio below 1 splits the optimizer's sub-groups between the GPU and CPU-Adam: ZeRO-3 only
    (offload_config.py: "Only valid with ZeRO Stage 3"), with the optimizer offloaded to the CPU (stage3.py
    builds the GPU half's optimizer only beside DeepSpeedCPUAdam)."""
    ratio = values.get("offload_ratio")
    if ratio is None or ratio >= 1:
        return None
    if values.get("zero_stage") in ("1", "2"):
        return f"--offload-ratio {ratio:g} needs ZeRO-3 (DeepSpeed splits the optimizer only at stage 3)"
    if values.get("offload_optimizer") in ("none", "nvme"):
        return f"--offload-ratio {ratio:g} needs --offload-optimizer cpu (or auto)"
    return None


def _bf16_states_need_offload(values: Mapping[str, object]) -> str | None:
    """bf16_optimizer_states: DeepSpeed keeps the moments in bf16 inside DeepSpeedCPUAdam (base_optimizer.py
    `_configure_master_weights`: it needs bf16 master weights, and ZeRO-Offload with the CPU optimizer)."""
    if values.get("optimizer_states") != "bf16":
        return None
    if values.get("offload_optimizer") in ("none", "nvme"):
        return "--optimizer-states bf16 needs the optimizer on the CPU: --offload-optimizer cpu (or auto)"
    if values.get("precision") == "fp16":
        return "--optimizer-states bf16 needs bf16 training: drop --precision fp16"
    return None


def _zenflow_needs_cpu_offload(values: Mapping[str, object]) -> str | None:
    """ZenFlow steps the optimizer with ZenFlowCPUAdam beside the offloaded states (engine.py
    `get_optimizer_configuration`), and replaces gradient accumulation with its update interval
    (zenflow/engine.py `configure_zenflow` sets gradient_accumulation_steps = update_interval)."""
    if not values.get("zenflow"):
        return None
    if values.get("offload_optimizer") in ("none", "nvme"):
        return "--zenflow needs the optimizer on the CPU: --offload-optimizer cpu (or auto)"
    if (values.get("grad_accum") or 1) > 1:
        return (
            f"--zenflow replaces gradient accumulation with its own interval: drop --grad-accum "
            f"{values['grad_accum']} (--zenflow-interval sets how often the CPU updates)"
        )
    # ZenFlowCPUAdam is not the exact DeepSpeedCPUAdam type that a split optimizer (stage3.py "Hybrid Optimizer
    # Only Supports DeepSpeedCPUAdam") and bf16 master weights (base_optimizer.py `_configure_master_weights`) assert
    if values.get("offload_ratio") is not None and values["offload_ratio"] < 1:
        return (
            "--zenflow and a partial --offload-ratio exclude each other (DeepSpeed asserts DeepSpeedCPUAdam): drop one"
        )
    if values.get("optimizer_states") == "bf16":
        return "--zenflow and --optimizer-states bf16 exclude each other (DeepSpeed asserts DeepSpeedCPUAdam): drop one"
    return None


def _activation_offload_needs_checkpointing(values: Mapping[str, object]) -> str | None:
    """Offloaded activations are the checkpointed layer inputs (host_buffers.py [act-offload]): without recomputation
    every layer's activations would cross PCIe twice, which the plan does not propose."""
    if values.get("offload_activations") == "cpu" and values.get("activation_checkpointing") is False:
        return "--offload-activations cpu keeps the checkpointed activations: drop --no-activation-checkpointing"
    return None


def _lora_options_need_lora(values: Mapping[str, object]) -> str | None:
    """The --lora-* options shape an adapter: without --lora there is none."""
    if values.get("lora"):
        return None
    changed = [
        DECLARATIONS[name].flag
        for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target")
        if name in values and values[name] != DECLARATIONS[name].default
    ]
    return f"{', '.join(changed)} shape a LoRA adapter: add --lora" if changed else None


def _merge_needs_lora(values: Mapping[str, object]) -> str | None:
    if values.get("merge") and not values.get("lora"):
        return "--merge merges a LoRA adapter into its base: add --lora (full fine-tuning's OUT/final is whole already)"
    return None


def _lora_dropout_range(values: Mapping[str, object]) -> str | None:
    dropout = values.get("lora_dropout")
    if dropout is not None and dropout >= 1:
        return f"--lora-dropout must be below 1, got {dropout:g}"
    return None


def _model_given(values: Mapping[str, object]) -> str | None:
    if "model" in values and values["model"] is None:
        return "missing --model ID|DIR; pass one, or --recipe NAME (offload-launch recipes lists them)"
    return None


def _smoke_options_need_smoke(values: Mapping[str, object]) -> str | None:
    if values.get("smoke") is False:
        for name in ("smoke_layers", "junit_xml"):
            if values.get(name):
                return f"{declaration(name).flag} only applies to a smoke test: add --smoke"
    return None


def _smoke_needs_data(values: Mapping[str, object]) -> str | None:
    if values.get("smoke") and values.get("data") is None:
        return "--smoke trains a few steps on real data: add --data PATH"
    return None


def _smoke_is_not_a_dry_run(values: Mapping[str, object]) -> str | None:
    if values.get("smoke") and values.get("dry_run"):
        return "--smoke and --dry-run exclude each other: a smoke test runs; drop one"
    return None


def _sbatch_is_a_training_job(values: Mapping[str, object]) -> str | None:
    """The batch script runs this command as a training run on the allocation; a smoke test runs here."""
    if not values.get("sbatch"):
        return None
    if values.get("smoke"):
        return "--sbatch writes a training job and --smoke runs here; drop one"
    if "data" in values and values["data"] is None:
        return "--sbatch writes a training job: add --data PATH"
    return None


def _one_eval_source(values: Mapping[str, object]) -> str | None:
    """Held-out loss comes from one place: a file of its own, or a share of the training rows."""
    fraction = values.get("eval_fraction")
    if values.get("eval_data") and fraction is not None:
        return "--eval-data and --eval-fraction both name held-out data; pass one"
    if fraction is not None and not 0 < fraction < 1:
        return f"--eval-fraction must be between 0 and 1, got {fraction:g}"
    return None


CROSS_FIELD_RULES: tuple[Callable[[Mapping[str, object]], str | None], ...] = (
    _model_given,
    _offload_needs_zero3,
    _nvme_optimizer_needs_zero3,
    _offload_ratio_range,
    _partial_offload_needs_zero3_cpu,
    _bf16_states_need_offload,
    _zenflow_needs_cpu_offload,
    _activation_offload_needs_checkpointing,
    _lora_options_need_lora,
    _lora_dropout_range,
    _merge_needs_lora,
    _smoke_options_need_smoke,
    _smoke_needs_data,
    _smoke_is_not_a_dry_run,
    _sbatch_is_a_training_job,
    _one_eval_source,
)


def problems(values: Mapping[str, object]) -> list[str]:
    """Every problem with `values` (a partial mapping is fine: absent settings are not checked)."""
    found = []
    for name, value in values.items():
        d = DECLARATIONS.get(name)
        if d is not None:
            found += [p for p in (_bound_problem(d, value), _choice_problem(d, value)) if p]
    return found + [p for rule in CROSS_FIELD_RULES if (p := rule(values))]


def validate(values: Mapping[str, object]) -> None:
    """Raise one UserInputError naming every problem, '; '-separated, flag first."""
    found = problems(values)
    if found:
        raise UserInputError("; ".join(found))


# ------------------------------------------------------------------------------------------ layering


def _contradiction(name: str, typed: object, pinned: object, ds_config: str | None) -> str | None:
    """A typed value that disagrees with the user's ds_config (a typed 'auto' or the same value agrees)."""
    mine = str(typed).rstrip("/")
    if mine in ("auto", str(pinned).rstrip("/")):
        return None
    return f"{declaration(name).flag} {typed} contradicts {pinned!r} in --ds-config {ds_config}; set it in one place"


def layer(
    typed: Mapping[str, object],
    *,
    recipe: Mapping[str, object] | None = None,
    mode: Mapping[str, object] | None = None,
    pins: Mapping[str, object] | None = None,
) -> Settings:
    """The run's settings: defaults < recipe < mode defaults < ds_config pins < typed values.

    typed: only what the user typed. mode: defaults of a mode (--smoke runs 3 steps unless --steps is typed,
    whatever the recipe says). pins: what the user's ds_config fixes (stage, offload devices, batch); a typed
    value that contradicts a pin is refused, a typed 'auto' yields to it.
    """
    values = defaults() | dict(recipe or {}) | dict(mode or {}) | dict(typed)
    for name, pinned in (pins or {}).items():
        if name in typed and (problem := _contradiction(name, typed[name], pinned, values["ds_config"])):
            raise UserInputError(problem)
        values[name] = pinned
    return Settings(**values, typed=frozenset(typed))
