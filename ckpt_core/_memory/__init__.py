"""The closed-form memory model: ledgers, per-tier estimate, transient, FLOPs, advice.

Private implementation: import the public names from `ckpt_core`.
"""
