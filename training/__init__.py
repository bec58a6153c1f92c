"""GRPO training of ParallelSearch agents via TRL (``python training/run_grpo.py``)."""
