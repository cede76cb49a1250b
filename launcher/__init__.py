"""offload-launch: plan, configure and launch DeepSpeed offload training."""

__version__ = "0.1.0"
