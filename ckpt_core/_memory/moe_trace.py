"""An MoE layer's routed experts for the step replay: the router and transformers'
grouped_mm experts, op by op.

The tensors are those `ckpt_core._memory.families.decoder_mlp.routed_mlp` counts
(Qwen3-MoE's ``TopKRouter`` and ``grouped_mm_experts_forward`` in
transformers/integrations/moe.py), made and freed in that code's order: the
router's logits (the block's local ``_`` until it returns), its fp32 softmax,
top-k and their normalization, the rows sorted by expert, the gathered input,
the stacked gate / up and down products, the weighted rows put back in token
order and summed per token.  The experts are three stacked parameters, so their
gradients are three tensors per layer as large as the experts themselves: what
shapes a full fine-tune's pool.  PEFT's adapters on them rebuild each adapted
stack every forward (``W + scaling * lhs @ rhs``), which the grouped matmul
keeps.  Other routers (gpt-oss's clamped SwiGLU, GLM-4.5's and DeepSeek's fp32
sigmoid) are replayed as this one at their sizes.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import mlp
from ckpt_core._memory.linear_trace import TraceRecipe, adapted, linear

GATE_UP = "mlp.experts.gate_up_proj"
DOWN = "mlp.experts.down_proj"


def shared_module(arch: Arch) -> str:
    """Where the shared expert is: Qwen2-MoE's ``shared_expert``, GLM-4.5's ``shared_experts``."""
    return "mlp.shared_expert" if arch.shared_expert_gate else "mlp.shared_experts"


def expert_parameters(arch: Arch) -> list[tuple[str, int, int, int]]:
    """The stacked experts and the router's weight of one MoE layer, in module order:
    (name, stacked matrices, fan in, fan out); none is a linear module."""
    h, inter, experts = arch.hidden, arch.moe_intermediate, arch.experts
    return [
        (GATE_UP, experts, h, 2 * inter),
        (DOWN, experts, inter, h),
        ("mlp.gate.weight", 1, h, experts),
    ]


def stack_rank(name: str, rank: int) -> int:
    """PEFT's adapter rank on an adapted matrix: the stacked gate and up are adapted
    together, each at the LoRA rank; anything else at the LoRA rank."""
    return rank * (2 if name == GATE_UP else 1)


def moe_mlp(sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe) -> int:
    """An MoE layer's MLP on the normed ``x``: the routed experts, and a shared expert
    added: Qwen2-MoE's first, later scaled by ``sigmoid(shared_expert_gate(x))``;
    GLM-4.5's and DeepSeek's after the experts.  The router's outputs are the block's
    locals until it returns."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    inter = arch.shared_expert_intermediate
    module = shared_module(arch)
    shared = None
    if inter and arch.shared_expert_gate:
        shared = mlp(sim, x, arch=arch, recipe=recipe, module=module, inter=inter)
    routing = _router(sim, x, arch=arch, recipe=recipe)
    out = _grouped_experts(sim, x, routing[0], arch=arch, recipe=recipe)
    if shared is not None:
        gate = linear(sim, x, "mlp.shared_expert_gate", (h, 1), recipe)
        sigmoid = sim.op([gate], act * tokens, save_out=True)
        sim.drop(gate)
        scaled = sim.op([sigmoid, shared], act * tokens * h, save=[sigmoid, shared])
        sim.drop(sigmoid, shared)
        shared = scaled
    elif inter:
        shared = mlp(sim, x, arch=arch, recipe=recipe, module=module, inter=inter)
    if shared is not None:
        total = sim.op([out, shared], act * tokens * h, alias=True)
        sim.drop(out, shared)
        out = total
    sim.drop(*routing)
    return out


def _router(sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe) -> tuple[int, int, int]:
    """The top-k router (Qwen3-MoE's ``TopKRouter``): returns the routing weights, the
    chosen experts' indices and the logits."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    rows, experts = tokens * arch.top_k, arch.experts
    weight_bytes = recipe.kept if recipe.quantized else recipe.weights
    trained = recipe.full
    router_in = x
    if arch.fp32_router and act != 4:
        router_in = sim.op([x], 4 * tokens * h)
    logits = sim.op(
        [router_in],
        (4 if arch.fp32_router else act) * tokens * experts,
        save=[router_in] if trained else [],
        saves_other=True,
        param_grad=weight_bytes * experts * h if trained else 0,
        matmul=True,
    )
    if router_in != x:
        sim.drop(router_in)
    probs = sim.op([logits], 4 * tokens * experts, save_out=True)
    index = sim.new(8 * rows)  # topk's indices, which its backward keeps
    values = sim.op([probs], 4 * rows, save=[index])
    sim.drop(probs)
    if arch.norm_topk:  # `router_top_value /= router_top_value.sum(...)`, in place
        total = sim.op([values], 4 * tokens)
        normed = sim.op([values, total], 4 * rows, save=[values, total], alias=True)
        sim.drop(values, total)
        values = normed
    weights = values
    if arch.router_in_dtype and act != 4:
        weights = sim.op([values], act * rows)
        sim.drop(values)
    return weights, index, logits


def _grouped_experts(sim: Sim, x: int, weights: int, *, arch: Arch, recipe: TraceRecipe) -> int:
    """grouped_mm_experts_forward; its locals die as it returns."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    rows, inter, experts = tokens * arch.top_k, arch.moe_intermediate, arch.experts
    sorted_ids, perm = sim.new(8 * rows), sim.new(8 * rows)
    token_index = sim.new(8 * rows)  # perm // top_k
    # An index's backward makes zeros of its input's size and index_puts into a new tensor.
    selected = sim.op([x], act * rows * h, save=[token_index], backward_temps=[act * tokens * h])
    row_weights = sim.op(
        [weights], sim.size(weights), save=[perm], backward_temps=[sim.size(weights)]
    )
    histogram_in = sim.new(4 * rows)
    counts = sim.new(4 * experts)
    offsets = sim.new(4 * experts)
    gate_up = _grouped_mm(sim, selected, GATE_UP, (h, 2 * inter), arch=arch, recipe=recipe)
    gate, up = sim.views(gate_up, [act * rows * inter] * 2)
    sim.drop(gate_up)
    activated = sim.op([gate], act * rows * inter, save=[gate])
    product = sim.op([activated, up], act * rows * inter, save=[activated, up])
    sim.drop(activated, gate, up)
    down = _grouped_mm(sim, product, DOWN, (inter, h), arch=arch, recipe=recipe)
    sim.drop(product)
    # The weights' gradient is `(grad * down).sum(-1)`: a product of the rows' size first.
    weighted = sim.op(
        [down, row_weights],
        act * rows * h,
        save=[down, row_weights],
        backward_scratch=[act * rows * h],
    )
    sim.drop(down)
    inverse = sim.new(8 * rows)
    positions = sim.new(8 * rows)  # torch.arange, scattered into the inverse permutation
    sim.drop(positions)
    ordered = sim.op([weighted], act * rows * h, save=[inverse], backward_temps=[act * rows * h])
    sim.drop(weighted)
    out = sim.op([ordered], act * tokens * h)
    sim.drop(ordered, inverse, sorted_ids, perm, token_index, selected, row_weights)
    sim.drop(histogram_in, counts, offsets)
    return out


def _grouped_mm(
    sim: Sim, x: int, name: str, shape: tuple[int, int], *, arch: Arch, recipe: TraceRecipe
) -> int:
    """One stacked projection over the sorted rows ``x``; an adapted stack is first rebuilt
    from the base weight and the adapter's fp32 factors cast to its dtype (copies, which
    the ``baddbmm`` keeps), and the grouped matmul keeps the rebuilt stack."""
    fan_in, fan_out = shape
    out_bytes = recipe.act * recipe.batch * recipe.seq * arch.top_k * fan_out
    weight_bytes = recipe.kept if recipe.quantized else recipe.weights
    stacked = weight_bytes * arch.experts * fan_in * fan_out
    if not (recipe.lora_rank and adapted(recipe, name)):
        return sim.op(
            [x],
            out_bytes,
            save=[x] if recipe.full else [],
            saves_other=True,
            param_grad=stacked if recipe.full else 0,
            matmul=True,
        )
    factors = arch.experts * stack_rank(name, recipe.lora_rank) * (fan_in + fan_out)
    if weight_bytes == 4:  # the fp32 factors themselves
        rebuilt = sim.op([], stacked, saves_other=True, param_grad=4 * factors, matmul=True)
    else:
        cast = sim.op([], weight_bytes * factors, param_grad=4 * factors)
        rebuilt = sim.op([cast], stacked, save=[cast], matmul=True)
        sim.drop(cast)
    out = sim.op([x, rebuilt], out_bytes, save=[x, rebuilt], matmul=True)
    sim.drop(rebuilt)
    return out
