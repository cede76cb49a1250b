"""Plan: the decision framework. Memory per tier and step time for every ZeRO stage and offload tier, and the fastest
candidate that fits. Pure: no processes, no files.
"""
