"""Integrations of ckpt_core plans with training frameworks.

`ckpt_core.integrations.hf` (HuggingFace Trainer / TRL) imports transformers;
import it only in a worker that trains.
"""
