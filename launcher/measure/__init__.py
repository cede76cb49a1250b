"""Measuring this host: the probe's rates, ZeRO's per-tensor cost and the passes at a model's shapes, and their cache.

This stage times real work and writes what it measured; it never plans. It imports only inspection/ and the small
utilities: the plan reads what it measured as plain data, and job/measuring.py is the one place that needs both
sides (it builds the configs a measurement runs, decides its budget, and turns its raw timings into the figures the
plan reads)."""
