"""The vocabulary every layer shares: tiers, GPUs, the workload, TrainingArguments kwargs.

Private implementation: import the public names from `ckpt_core`.
"""
