"""Job: from a plan to a run on disk and a running launcher. The run folder, the run spec the ranks read, the host's
limits checked before launch, and DeepSpeed's launcher started and supervised.
"""
