"""Measurement on the meta device: activation bytes of a real forward, without memory.

Private implementation: import the public names from `ckpt_core`.
"""
