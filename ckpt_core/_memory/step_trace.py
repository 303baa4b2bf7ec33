"""The allocations of a real training step, replayed through the caching allocator.

`simulate` loads the model (bitsandbytes quantizes each linear but the LM head from a
compute-dtype copy; PEFT's kbit preparation re-allocates every other
parameter in fp32; adapters in fp32), then replays a warm-up step (its
optimizer step makes the optimizer states) and the measured step, each:
forward (checkpointed blocks keep their input only), the loss, backward
(recompute, then each op's gradients), the optimizer step (torch's foreach
AdamW holds one temporary per parameter for the denominator, the fused one
none, transformers' Adafactor those of `ckpt_core._memory.adafactor`);
gradients are freed by ``zero_grad(set_to_none=True)`` or kept
(``accumulate``).
Op by op, the buffers are those of transformers' Llama-style decoder block, the
same forward `ckpt_core._memory.activations` writes down (norms upcast to fp32,
q / k / v / o and the MLP projections with their LoRA adapters, RoPE, eager
attention's scores and fp32 softmax or a fused kernel, SwiGLU), so the reserved
pool (`CachingAllocator`) follows from the mechanism. Gemma 2, Gemma 3
(`gemma_trace`: sandwich norms, Gemma 3's q / k norms, scaled embeddings,
sliding-window masks, logit softcapping), OLMo-2 (`olmo2_trace`: post-norms,
full-width q / k norms, fp32 RoPE), EXAONE 4 (`exaone4_trace`: post-norms, q /
k norms per head, no RoPE on global layers), GLM-4 (`glm4_trace`: sandwich
norms, partial RoPE from interleaved copies; GLM: its attention in Llama's
layer), Command R (`cohere_trace`: an fp32 norm read by parallel attention
and MLP), GPT-2, OPT, GPT-NeoX, Falcon, BERT (`bert_trace`: post-LayerNorms,
token types, the masked-LM head's transform, the loss in the dtype) and T5
(`t5_trace`: two stacks, relative position bias, cross-attention) are
replayed as their own forward; the model's family chooses (`Family.trace`),
and routed-expert models are replayed with the Llama block and their experts.
Parameters a text-only step never runs (Gemma 3's vision tower) are loaded and
never trained (`Family.idle_tensors`).

Pure Python; results cached per (architecture, step, tier or placed plan, recipe).
"""

from __future__ import annotations

import functools

from ckpt_core._memory import adafactor
from ckpt_core._memory.activations import block_layout, block_modes
from ckpt_core._memory.allocator import CachingAllocator
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import BlockMode
from ckpt_core._memory.linear_trace import TraceRecipe, adapted, kept_in_fp32, left_unquantized
from ckpt_core._memory.model_trace import head_and_loss
from ckpt_core._memory.moe_trace import expert_parameters, shared_module, stack_rank
from ckpt_core._planning.tiers import ConcreteTier

__all__ = [
    "PlanModes",
    "TraceRecipe",
    "adafactor_temporary",
    "replayed_pool",
    "simulate",
    "trained_tensors",
]

# A tier, or every block's mode in module order.
PlanModes = ConcreteTier | tuple[BlockMode, ...]


@functools.lru_cache(maxsize=512)
def simulate(arch: Arch, plan: PlanModes, recipe: TraceRecipe) -> tuple[int, int]:
    """(peak allocated, peak reserved) of `replayed_pool`'s measured step, in bytes."""
    pool = replayed_pool(arch, plan, recipe)
    return pool.peak_allocated, pool.peak_reserved


def replayed_pool(arch: Arch, plan: PlanModes, recipe: TraceRecipe) -> CachingAllocator:
    """The caching allocator after the model's load, a warm-up step and the measured
    step; its peaks are the measured step's.  ``plan``: a tier, or every block's mode
    in module order (a placed block-level plan, `placement.placed_modes`).

    The warm-up step is replayed first: it makes the cuBLAS workspaces, kept
    for good, its ``optimizer.step()`` makes the optimizer states,
    ``zero_grad(set_to_none=True)`` at the measured step's
    start frees its gradients, and its segments stay cached, so the measured
    step best-fits into a pool that is already full of freed blocks (the
    steady state of every later step: replayed for the workload of every
    recorded GPU row, a third step reserves nothing more).  The step's output
    (its logits) is referenced until the step returns, through the optimizer
    step.
    """
    sim = Sim()
    trainable = _load(sim, arch, recipe)
    sim.accumulate = recipe.accumulate
    sim.first_grad_shared = recipe.full and arch.tied
    if recipe.accumulate:
        sim.param_grads = [sim.new(tensor.nbytes) for tensor in trainable]
    kept: dict[object, int] = {}  # Adafactor's states and RMS scalars, by its keys
    _step(sim, arch, plan, recipe, trainable=trainable, kept=kept, states=True)  # the warm-up
    if not recipe.accumulate:
        sim.drop(*sim.param_grads)
        sim.param_grads = []
    sim.allocator.peak_allocated = sim.allocator.allocated
    _step(sim, arch, plan, recipe, trainable=trainable, kept=kept, states=False)
    return sim.allocator


def _parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, stacked, fan in, fan out), where
    ``stacked`` is 0 for a linear module (what bitsandbytes quantizes and LoRA adapts as
    a linear) and the experts of a stacked parameter otherwise: the model's own
    (`TraceModel.parameters`), else Llama's."""
    own = family_of(arch).trace(arch).parameters
    return own(arch, index) if own is not None else _llama_parameters(arch, index)


def _llama_parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """A Llama-style layer's: the attention's, then the MLP's; in an MoE layer the routed
    experts and the router, then a shared expert."""
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    inter = arch.intermediate or arch.moe_intermediate * max(1, arch.top_k)
    output = (f"self_attn.{arch.o_name}", q, h)
    if arch.fused_qkv:  # Phi3Attention.__init__ makes o_proj first
        attention = [output, ("self_attn.qkv_proj", h, q + 2 * kv)]
    else:
        attention = [(f"self_attn.{x}_proj", h, n) for x, n in (("q", q), ("k", kv), ("v", kv))]
        attention.append(output)
    linears = [(name, 0, fan_in, fan_out) for name, fan_in, fan_out in attention]
    if _routed(arch, index):
        shared, module = arch.shared_expert_intermediate, shared_module(arch)
        mlp = []
        if shared:
            mlp = [(f"{module}.{x}_proj", h, shared) for x in ("gate", "up")]
            mlp.append((f"{module}.down_proj", shared, h))
            if arch.shared_expert_gate:
                mlp.append(("mlp.shared_expert_gate", h, 1))
        return linears + expert_parameters(arch) + [(name, 0, i, o) for name, i, o in mlp]
    up, down = arch.mlp_names
    if arch.fused_gate_up:
        mlp = [("mlp.gate_up_proj", h, 2 * inter)]
    else:
        mlp = [("mlp.gate_proj", h, inter)] if arch.glu else []
        mlp.append((f"mlp.{up}", h, inter))
    mlp.append((f"mlp.{down}", inter, h))
    return linears + [(name, 0, fan_in, fan_out) for name, fan_in, fan_out in mlp]


def _weight_bytes(recipe: TraceRecipe, name: str) -> int:
    """Bytes per element of a block matrix as loaded: 4 for one kept in fp32 (T5's wo)."""
    return 4 if kept_in_fp32(recipe, name) else recipe.weights


def _routed(arch: Arch, index: int) -> bool:
    return arch.is_moe and arch.moe_layers[index]


def trained_tensors(arch: Arch, recipe: TraceRecipe) -> list[adafactor.Trained]:
    """The trained matrices in ``model.parameters()`` order (the optimizer makes its states
    and steps in that order): a full fine-tune's token embeddings, block and head matrices
    (a stack of experts as one tensor) and untied LM head; else the adapters, A (rank x
    fan_in) then B (fan_out x rank), a stack's for all its experts."""
    trained: list[adafactor.Trained] = []
    weights, rank = recipe.weights, recipe.lora_rank
    if recipe.full:
        embedding = adafactor.Trained(weights, arch.vocab, arch.hidden)
        trained.append(embedding)
        trained.extend(adafactor.Trained(weights, rows, arch.hidden) for rows in _tables(arch))
        for name, stacked, fan_in, fan_out in _matrices(arch):
            size = _weight_bytes(recipe, name)
            trained.append(adafactor.Trained(size, max(1, stacked) * fan_out, fan_in))
        if not arch.tied:
            trained.append(embedding)
    for name, stacked, fan_in, fan_out in _matrices(arch) if rank else ():
        if adapted(recipe, name):
            width = max(1, stacked) * stack_rank(name, rank)
            trained.append(adafactor.Trained(4, width, fan_in))
            trained.append(adafactor.Trained(4, fan_out, width))
    return trained


def _matrices(arch: Arch) -> list[tuple[str, int, int, int]]:
    """Every layer's matrices (`_parameters`), then the head's before the LM head
    (`TraceModel.head`: BERT's transform), in module order."""
    head = family_of(arch).trace(arch).head(arch)
    return [item for index in _blocks(arch) for item in _parameters(arch, index)] + list(head)


def _blocks(arch: Arch) -> range:
    """Every block's index, across the stacks, in module order (`block_layout`'s)."""
    return range(len(block_layout(arch)))


@functools.lru_cache(maxsize=512)
def adafactor_temporary(arch: Arch, recipe: TraceRecipe) -> int:
    """`adafactor.step_temporary` over `trained_tensors`: cached, since the closed form
    asks on every call and the walk is thousands of events for an 8B model."""
    return adafactor.step_temporary(trained_tensors(arch, recipe))


def _load(sim: Sim, arch: Arch, recipe: TraceRecipe) -> list[adafactor.Trained]:
    """Allocate the model as loaded and prepared (the adapters last, after those on an
    idle tower); returns `trained_tensors`."""
    # A tower text-only training never runs: loaded, never trained.
    idle_tensors = family_of(arch).idle_tensors(arch)
    if recipe.device_map:  # unquantized: nothing is re-allocated after the load
        _load_from_checkpoint(sim, arch, recipe, [recipe.weights * n for n, _ in idle_tensors])
    else:
        # First in module order; the tensors bitsandbytes leaves as loaded are kept, for
        # PEFT's preparation to cast.
        loaded = (_load_tensor(sim, recipe, n, rows) for n, rows in idle_tensors)
        idle = [tensor for tensor in loaded if tensor is not None]
        embeddings, others = _load_and_move(sim, arch, recipe)
        if recipe.quantized and recipe.kept != recipe.weights:  # PEFT's kbit preparation
            for tensor in idle + embeddings + others:
                sim.new(sim.size(tensor) // recipe.weights * recipe.kept)
                sim.drop(tensor)
    for size in recipe.idle_adapters:  # PEFT's adapters on the idle tower come first
        sim.new(size)
    trained = trained_tensors(arch, recipe)
    if not recipe.full:
        for tensor in trained:
            sim.new(tensor.nbytes)
    return trained


def _load_and_move(sim: Sim, arch: Arch, recipe: TraceRecipe) -> tuple[list[int], list[int]]:
    """Parameter by parameter in module order, each in a block of its own (loaded on the
    CPU and moved with ``.to(device)``; a quantized model as bitsandbytes quantizes
    each block linear from a copy on the device: 4-bit packed weights and their
    absmax, or int8 rows and their fp32 scales; the head's too, BERT's transform: only
    the output embeddings stay unquantized).  Returns the embeddings and the other
    parameters bitsandbytes leaves as loaded: the norms, and the stacked experts (it
    quantizes linear modules only)."""
    embeddings = [sim.new(recipe.weights * arch.vocab * arch.hidden) for _ in _heads(arch)]
    embeddings += [sim.new(recipe.weights * rows * arch.hidden) for rows in _tables(arch)]
    norms = family_of(arch).trace(arch).norms(arch)
    others = [sim.new(recipe.weights * arch.hidden) for _ in range(norms)]
    for name, stacked, fan_in, fan_out in _matrices(arch):
        if kept_in_fp32(recipe, name):  # kept in fp32 and never quantized (T5's wo)
            sim.new(4 * fan_in * fan_out)
        elif left_unquantized(recipe, name):  # as loaded, for PEFT's preparation to cast
            others.append(sim.new(recipe.weights * fan_in * fan_out))
        elif stacked:
            others.append(sim.new(recipe.weights * stacked * fan_in * fan_out))
        else:
            _load_tensor(sim, recipe, fan_in * fan_out, fan_out)
    return embeddings, others


def _load_tensor(sim: Sim, recipe: TraceRecipe, n: int, rows: int) -> int | None:
    """One parameter of ``n`` elements moved to the device: as loaded (returned), or a
    linear's weight (``rows`` > 0) quantized by bitsandbytes from a copy on the device
    (None: nothing of it is re-allocated afterwards)."""
    if not (recipe.quantized and rows):
        return sim.new(recipe.weights * n)
    if recipe.int8:
        # transformers' Bnb8bitQuantize: Int8Params(value.to("cpu")).to(device)
        # copies the loaded value back as fp16 and quantizes it row-wise.
        copies = sim.new(recipe.compute * n), sim.new(2 * n)
        sim.new(4 * rows)
        sim.new(n)
        sim.drop(*copies)
    else:
        copy = sim.new(recipe.compute * n)
        sim.new(n // 2)
        sim.new(n // 64 if recipe.double_quant else n // 16)
        sim.drop(copy)
    return None


def _load_from_checkpoint(sim: Sim, arch: Arch, recipe: TraceRecipe, idle_sizes: list[int]) -> None:
    """``from_pretrained`` with a device map, unquantized.  transformers'
    ``caching_allocator_warmup`` first allocates and frees one block of the model's
    size (a tied head counted once), then the checkpoint's tensors load into it in
    sorted key order (``dot_natural_key``: ``lm_head`` before ``model.*``; in a layer
    ``mlp.*`` before ``self_attn.*``; an idle tower's ``model.vision_tower.*`` after
    ``model.language_model.*``).  The norms, under 1 MiB, come from the small pool,
    so their place in that order changes nothing."""
    embedding = recipe.weights * arch.vocab * arch.hidden
    model = family_of(arch).trace(arch)
    linears = [
        _weight_bytes(recipe, name) * max(1, stacked) * fan_in * fan_out
        for index in _blocks(arch)
        for name, stacked, fan_in, fan_out in sorted(_parameters(arch, index))
    ]
    linears += [recipe.weights * i * o for _, _, i, o in model.head(arch)]
    norms = [recipe.weights * arch.hidden] * model.norms(arch)
    tables = [recipe.weights * rows * arch.hidden for rows in _tables(arch)]
    large = [embedding for _ in _heads(arch)] + tables + linears + idle_sizes
    total = sum(large) + sum(norms)
    sim.drop(sim.new(total // 2 * 2))  # torch.empty(byte_count // 2, dtype=torch.float16)
    for size in large + norms:
        sim.new(size)


def _tables(arch: Arch) -> tuple[int, ...]:
    """The rows of the model's other embedding tables (`TraceModel.tables`)."""
    return family_of(arch).trace(arch).tables(arch)


def _heads(arch: Arch) -> range:
    """The token embedding, and an untied LM head."""
    return range(1 if arch.tied else 2)


def _step(
    sim: Sim,
    arch: Arch,
    plan: PlanModes,
    recipe: TraceRecipe,
    *,
    trainable: list[adafactor.Trained],
    kept: dict[object, int],
    states: bool,
) -> None:
    """One training step: forward, backward, ``optimizer.step()`` (making the states
    when ``states``), then the step's output is dropped.  ``kept``: what Adafactor keeps
    from step to step."""
    held = _forward_backward(sim, arch, plan, recipe, recipe.blas_workspace if states else 0)
    count = recipe.optimizer_states
    if recipe.factored:
        _adafactor_step(sim, trainable, kept, first=states)
    elif states and count and recipe.state_bytes:
        # At its first step AdamW makes exp_avg and exp_avg_sq, SGD its momentum buffer.
        state = recipe.state_bytes / count
        for tensor in trainable:
            if recipe.device_steps:  # the fused step's `state["step"]`, fp32 on the device
                sim.new(4)
            for _ in range(count):
                sim.new(int(tensor.nbytes * state))
    if recipe.foreach_temp:
        sim.drop(*[sim.new(tensor.nbytes) for tensor in trainable])
    sim.drop(*held)


def _stack_ends(arch: Arch) -> dict[int, int]:
    """The index of each stack's last block -> the stack's."""
    ends, last = {}, -1
    for stack, blocks in enumerate(family_of(arch).stacks(arch)):
        last += blocks
        ends[last] = stack
    return ends


def _adafactor_step(
    sim: Sim, trainable: list[adafactor.Trained], kept: dict[object, int], *, first: bool
) -> None:
    """`adafactor.step_events` replayed; what it does not free (the states, the RMS
    scalars) stays in ``kept`` for the next step, whose RMS scalars replace them."""
    handles: dict[object, int] = {}
    for kind, key, size in adafactor.step_events(trainable, first=first):
        if kind == "new":
            handles[key] = sim.new(size)
        else:
            sim.drop(handles.pop(key) if key in handles else kept.pop(key))
    kept.update(handles)


def _forward_backward(
    sim: Sim, arch: Arch, plan: PlanModes, recipe: TraceRecipe, workspace: int
) -> list[int]:
    """One forward and backward; returns what the step's output still references.

    ``workspace``: the first step's cuBLAS workspace per thread, kept for good.
    """
    model = family_of(arch).trace(arch)
    ids = sim.new(8 * recipe.batch * recipe.seq)
    inputs = model.prepare(sim, arch, recipe, workspace)
    # Adapters: the frozen embedding's output has no history, and PEFT training calls
    # `model.enable_input_require_grads()` (transformers' PreTrainedModel: a forward hook
    # doing `output.requires_grad_(True)`), so it is a leaf.  Its AccumulateGrad node
    # holds it (torch/csrc/autograd/functions/accumulate_grad.h) and keeps its gradient
    # in `.grad`; the graph lives as long as the step's output (`out.loss.grad_fn`), so
    # both are freed with it, after optimizer.step(), not after the first block.
    if recipe.full:
        leaves = []
    elif inputs.leaf is not None:  # the forward rebound its name: its reference passes on
        leaves = [inputs.leaf]
    else:
        leaves = [sim.hold(inputs.hidden)]
    sim.blas_workspace = workspace  # autograd's device thread: at the backward's first matmul
    hidden = inputs.hidden
    modes = block_modes(arch, plan) if isinstance(plan, str) else plan
    ends = _stack_ends(arch)
    for index, mode in enumerate(modes):
        layer = functools.partial(model.block, arch=arch, recipe=recipe, inputs=inputs, index=index)
        if mode == "full":
            out = sim.checkpoint(layer, hidden)
        else:
            out = layer(sim, hidden, selective=mode == "selective")
        sim.drop(hidden)
        hidden = out
        if model.stack_end is not None and index in ends:
            hidden = model.stack_end(
                sim, hidden, arch=arch, recipe=recipe, inputs=inputs, stack=ends[index]
            )
    held = inputs.step_held
    if all(mode == "off" for mode in modes):  # no recompute reads them: they die here
        sim.drop(*inputs.forward_held)
    else:
        held += inputs.forward_held
    loss, logits = head_and_loss(
        sim,
        hidden,
        arch=arch,
        recipe=recipe,
        model=model,
        inputs=inputs,
        loss_in_dtype=not family_of(arch).loss_in_fp32,
    )
    leaves += inputs.leaves
    leaf_grads = sim.backward(loss, leaves=leaves)
    sim.drop(ids, *held)
    if recipe.logits:
        return [loss, logits, *inputs.returned_outputs, *leaves, *leaf_grads]
    return [loss, *leaves, *leaf_grads]
