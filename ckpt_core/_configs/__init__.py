"""Model configs: bundled presets, validation of config JSON, parameter-size bounds.

Private implementation: import the public names from `ckpt_core`.
"""
