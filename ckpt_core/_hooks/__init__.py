"""Checkpoint hooks on real models: block discovery, install and remove.

Private implementation: import the public names from `ckpt_core`.
"""
