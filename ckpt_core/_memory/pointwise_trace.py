"""Pointwise op chains the replay runs as the models write them, in Python.

Each op makes a new tensor and each rebinding frees its input, so the chain's
temporaries (and what autograd saves of them) shape the caching allocator's
pool: a Python-float scaling, Gemma's logit softcapping, and transformers'
``NewGELUActivation`` (GPT-2's and Phi's ``gelu_new``).  Pure Python.
"""

from __future__ import annotations

from ckpt_core._memory.autograd_sim import Sim

__all__ = ["gelu_new", "scaled", "softcap"]


def scaled(sim: Sim, x: int, size: int) -> int:
    """``x = x * c`` (or ``/ c``) for a Python float: a new tensor that saves nothing,
    and the rebinding frees ``x``."""
    out = sim.op([x], size)
    sim.drop(x)
    return out


def softcap(sim: Sim, x: int, size: int) -> int:
    """Gemma's logit softcapping, ``x = x / cap; x = tanh(x); x = x * cap``: each op makes
    a new tensor and the rebinding frees its input (tanh's output is saved for backward)."""
    divided = sim.op([x], size)
    sim.drop(x)
    tanh = sim.op([divided], size, save_out=True)
    sim.drop(divided)
    out = sim.op([tanh], size)
    sim.drop(tanh)
    return out


def gelu_new(sim: Sim, x: int, size: int) -> int:
    """NewGELUActivation, written out in Python: ``0.5 * x * (1.0 + torch.tanh(c * (x +
    0.044715 * torch.pow(x, 3.0))))``, left to right; pow keeps x, tanh its output, the
    last product both factors."""
    half = sim.op([x], size)
    cube = sim.op([x], size, save=[x])
    term = scaled(sim, cube, size)
    inner = sim.op([x, term], size)
    sim.drop(term)
    times_c = scaled(sim, inner, size)
    tanh = sim.op([times_c], size, save_out=True)
    sim.drop(times_c)
    one_plus = scaled(sim, tanh, size)
    out = sim.op([half, one_plus], size, save=[half, one_plus])
    sim.drop(half, one_plus)
    return out
