"""Rank: what runs inside every training process DeepSpeed's launcher starts (`python -m launcher.rank`). It reads
OUT/run_spec.json and OUT/ds_config.json and knows nothing about planning.
"""
