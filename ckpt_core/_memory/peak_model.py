"""The one peak function: a step's activations, transient, allocated peak and process
memory for an assignment of modes to blocks (a tier or a block-level plan).

`tier_memory` replays a tier, or a block-level plan as placed, through the caching
allocator (`ckpt_core._memory.step_trace`); `PeakModel` holds what a step's peak
needs besides the assignment (its model states and recipe from
`ckpt_core._memory.estimate`) and the cheaper models searches judge plans by.

Pure arithmetic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ckpt_core._memory.activations import Assignment, activation_bytes, tier_named
from ckpt_core._memory.allocator import ROUND_LARGE
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.context import DEFAULT_CONTEXT_BYTES
from ckpt_core._memory.estimate import StaticMemory
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import Step
from ckpt_core._memory.peak import Recipe, allocated_moments
from ckpt_core._memory.placement import placed_modes
from ckpt_core._memory.step_trace import simulate
from ckpt_core._memory.transient import transient_bytes
from ckpt_core._memory.workspace import blas_workspace_bytes


@dataclass(frozen=True, slots=True)
class TierMemory:
    """One tier's activation bytes and estimated peak (bytes)."""

    activation_bytes: int
    transient_bytes: int
    allocated_bytes: int  # torch.cuda.max_memory_allocated() of the step
    peak_bytes: int  # process memory: CUDA context + the caching allocator's reserved pool


# auto's searches and the alternatives ask for the same peaks again on every repeated
# request; every argument is a frozen value, so the answer is cached.
@functools.lru_cache(maxsize=8192)
def tier_memory(
    arch: Arch,
    step: Step,
    assignment: Assignment,
    static: StaticMemory,
    recipe: Recipe | None = None,
    *,
    context_bytes: int = DEFAULT_CONTEXT_BYTES,
    replay: bool = True,
    plans_from_full: bool = False,
) -> TierMemory:
    """Activations (closed form), transient, the allocated peak and process memory.

    The one peak function: the tiers' estimate, ``auto``'s search over
    block-level plans and the alternatives all call it (through `PeakModel`).
    Without a `Recipe`, gradients are held all step (the conservative old
    default).  A tier, or a block-level assignment placed as ``auto`` places it
    (`ckpt_core._memory.placement`), is replayed through the caching allocator.
    ``plans_from_full``: a block-level assignment is not replayed but takes the
    closed-form allocated peak plus what the closed form misses at the full
    tier's replayed one (and at least that peak), and the full tier's replayed
    fragmentation: the search's model, which the plan it finds is then replayed
    against.  ``replay=False`` skips the replay: the peak is then the closed-form
    allocated peak + context, a quick estimate for searches.
    """
    activations = activation_bytes(arch, step, assignment)
    transient = transient_bytes(arch, step, assignment)
    recipe = recipe or Recipe(gradients=static.gradients, gradients_held=True)
    # Everything resident but the gradients (sharded states, gathered units, buckets).
    resident = static.total - static.gradients
    moments = allocated_moments(arch, step, assignment, resident, recipe)
    allocated = max(moments.values())
    # The cuBLAS workspaces of the Python thread and of autograd's device thread.
    trace = recipe.trace
    workspaces = 2 * (trace.blas_workspace if trace is not None else blas_workspace_bytes(None))
    if trace is None or not replay:
        reserved = -(-allocated // ROUND_LARGE) * ROUND_LARGE
        allocated += workspaces
        reserved += workspaces
    else:
        # A tier's assignment, however it is given, is replayed as the tier: one
        # assignment, one peak (a walk that reaches every block full gets full's).
        tier = assignment if isinstance(assignment, str) else tier_named(arch, assignment)
        placed = (
            placed_modes(arch, assignment)
            if tier is None and not plans_from_full and not isinstance(assignment, str)
            else None
        )
        simulated, reserved = simulate(arch, placed or tier or "full", trace)
        # The replay holds one whole replica: a GPU of a sharded group (its share, the
        # gathered units, the buckets) takes the closed-form peak, and the replay's
        # fragmentation on top.  The replay allocates the workspaces itself.
        exact = static.total == static.replica_total and family_of(arch).replayed_exactly(arch)
        if exact and (tier is not None or placed is not None):
            allocated = simulated
        else:
            allocated += workspaces
            if exact:
                # Between the tiers a plan holds at least what full holds, and what the
                # closed form misses at full (the replay's excess over it) it misses too.
                full = max(allocated_moments(arch, step, "full", resident, recipe).values())
                allocated = max(allocated + max(0, simulated - full - workspaces), simulated)
        reserved = allocated + reserved - simulated
    return TierMemory(activations, transient, allocated, reserved + context_bytes)


@dataclass(frozen=True, slots=True)
class PeakModel:
    """What a step's peak needs besides the assignment: its model states and recipe."""

    static: StaticMemory
    recipe: Recipe | None = None
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    replay: bool = True
    plans_from_full: bool = False

    def of(self, arch: Arch, step: Step, assignment: Assignment) -> TierMemory:
        return tier_memory(
            arch,
            step,
            assignment,
            self.static,
            self.recipe,
            context_bytes=self.context_bytes,
            replay=self.replay,
            plans_from_full=self.plans_from_full,
        )

    def searching(self) -> PeakModel:
        """The same model with block-level plans judged from the full tier's replay, with
        no replay of their own: a search's, whose answer is then replayed as placed."""
        return replace(self, plans_from_full=True)

    def quick(self) -> PeakModel:
        """The same model without the allocator replay: a cheap lower bound of its peak."""
        return replace(self, replay=False)
