"""Inspect: what is there before planning. The model (exact parameter count, largest tensor, shape), the host (GPUs,
memory, PCIe, CPU RAM, NVMe, memlock, libaio; live or described) and the measured rates the step-time model uses.
"""
