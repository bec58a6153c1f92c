"""Training ParallelSearch agents via TRL: gold trajectories (``training/gold.py``), the supervised warm start
(``training/run_sft.py``) and GRPO on the agent's own trajectories (``training/run_grpo.py``)."""
