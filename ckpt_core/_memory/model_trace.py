"""What a model runs around its decoder layers, for the step replay.

A model's `TraceModel`, which its family selects
(`ckpt_core._memory.family.Family.trace`): the embeddings, masks and rotary
tables before the first layer (`Inputs`), one layer, and the final norm.
Llama's (`LLAMA`) is the default; `ckpt_core._memory.gemma_trace` and
`ckpt_core._memory.olmo2_trace` hold their families' own.  Used by
`ckpt_core._memory.step_trace`; sizes in bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import block, norm
from ckpt_core._memory.fused_trace import dropout, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.moe_trace import moe_mlp
from ckpt_core._memory.pointwise_trace import scaled, softcap


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the model's forward makes before its first block.

    ``hidden``: the first block's input; ``mask``: the attention mask the
    full-attention layers read, ``sliding_mask`` the sliding ones' (None: no
    mask, sdpa's causal flag); ``step_held``: dropped when the backward is done
    (what the graph or a checkpoint still references to the end);
    ``forward_held``: dropped before the head when no block is checkpointed
    (nothing saves them), else with ``step_held`` (the checkpoints' recomputes
    read them).  ``leaf``: the adapters' leaf when it is not ``hidden`` (Granite
    scales the embedding's output after the input-grad hook made it a leaf); its
    reference passes to the step, whose AccumulateGrad node holds it.
    ``unread``: what the model's forward holds that no layer reads (Ministral's
    unused full mask, GPT-2's embedding lookups): it dies as the forward returns.
    ``returned``: what the last block returned beside its output (Falcon's eager
    weights), which the model's loop holds until the next block returns; the last
    block's die as the forward returns.
    ``shared``: what blocks hand to later ones (T5's biases and masks, the encoder's
    output); ``until_loss``: what the model's forward holds until it has computed the
    loss (T5's decoder output, its shifted labels); ``returned_outputs``: what its
    output returns beside the logits (T5's encoder output), held with them;
    ``leaves``: further adapters' leaves (T5's
    decoder lookup).
    """

    hidden: int
    mask: int | None
    step_held: tuple[int, ...] = ()
    forward_held: tuple[int, ...] = ()
    sliding_mask: int | None = None
    leaf: int | None = None
    unread: tuple[int, ...] = ()
    returned: list[int] = field(default_factory=list)
    shared: dict[str, int] = field(default_factory=dict)
    until_loss: list[int] = field(default_factory=list)
    returned_outputs: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)

    def layer_mask(self, arch: Arch, index: int) -> int | None:
        """The mask layer ``index`` reads: its kind's."""
        sliding = bool(arch.sliding_layers) and arch.sliding_layers[index]
        return self.sliding_mask if sliding else self.mask

    @staticmethod
    def layer_rotary(arch: Arch, index: int) -> bool:
        """Whether layer ``index`` applies RoPE (not one of `Arch.nope_layers`)."""
        return not (arch.nope_layers and arch.nope_layers[index])


@dataclass(frozen=True, slots=True)
class TraceModel:
    """A model's forward around its blocks, as the replay runs it.

    ``prepare(sim, arch, recipe, workspace)``: the embeddings, masks and rotary
    tables, in the model's order (``workspace``: the first cuBLAS call's, 0 when
    made already); ``block(sim, x, arch=, recipe=, inputs=, index=, selective=)``:
    one decoder layer; ``norm``: the final norm; ``parameters(arch, index)``: layer
    ``index``'s matrices in module order, (name, experts of a stack or 0, fan in, fan
    out), when they are not Llama's (`ckpt_core._memory.step_trace`); ``tables(arch)``:
    the rows of its other hidden-wide embedding tables, loaded and trained after the
    token embeddings (GPT-2's positions); ``head(arch)``: the linears its head runs
    before the LM head's, as ``parameters`` lists them (BERT's transform, which ``norm``
    runs): loaded after the blocks, quantized, adapted and trained as theirs are;
    ``norm_in_head``: ``norm`` is the head's (BERT's transform), not the base model's
    last op.
    ``stack_end(sim, x, arch=, recipe=, inputs=, stack=)``: what runs
    after each stack's last block (T5's final norms, then the decoder's inputs),
    returning the next input; ``norms(arch)``: its small parameters (norms), loaded
    as hidden-wide tensors.
    """

    prepare: Callable[[Sim, Arch, TraceRecipe, int], Inputs]
    block: Callable[..., int]
    norm: Callable[[Sim, int, int, int, TraceRecipe], int]
    parameters: Callable[[Arch, int], list[tuple[str, int, int, int]]] | None = None
    tables: Callable[[Arch], tuple[int, ...]] = lambda arch: ()
    head: Callable[[Arch], tuple[tuple[str, int, int, int], ...]] = lambda arch: ()
    norm_in_head: bool = False
    stack_end: Callable[..., int] | None = None
    norms: Callable[[Arch], int] = lambda arch: 2 * arch.layers + 1


def embedding(sim: Sim, arch: Arch, recipe: TraceRecipe) -> int:
    """The token embeddings' output.

    Trained (a full fine-tune), EmbeddingBackward makes the weight's dense vocab x
    hidden gradient at the backward's end; tied to the LM head, whose backward made
    the weight's first gradient, the two are summed (`Sim.op`'s ``shared_weight``).
    Frozen, the output has no history (`step_trace` makes it the adapters' leaf).
    """
    size = recipe.residual * recipe.batch * recipe.seq * arch.hidden
    if not recipe.full:
        return sim.new(size, grad=True)
    weight = recipe.weights * arch.vocab * arch.hidden
    return sim.op([], size, param_grad=weight, shared_weight=arch.tied)


def llama_prepare(
    sim: Sim,
    arch: Arch,
    recipe: TraceRecipe,
    workspace: int,
    *,
    lookup_local: bool = True,
    mask_always: bool = False,
) -> Inputs:
    """LlamaModel.forward: the embeddings, the masks the layers read (`layer_masks`), the
    embeddings' dropout, then RoPE.  With dropout the lookup is the adapters' leaf, or
    a local of the forward (StarCoder2's ``inputs_embeds``; ``lookup_local`` False: the
    dropout's rebinding frees it, Phi's).  ``mask_always``: sdpa gets a materialized
    mask at any length (Falcon's ``allow_is_causal_skip=False``)."""
    hidden, leaf = embedding(sim, arch, recipe), None
    if arch.scalar_multipliers:  # GraniteModel: `inputs_embeds * self.embedding_multiplier`
        lookup = hidden
        hidden = sim.op([lookup], recipe.residual * recipe.batch * recipe.seq * arch.hidden)
        if recipe.full:  # no hook made it a leaf: the rebinding frees the lookup
            sim.drop(lookup)
        else:
            leaf = lookup
    full, sliding, held, forward_held, unread = layer_masks(sim, arch, recipe, always=mask_always)
    if arch.embed_dropout:
        tokens = recipe.batch * recipe.seq
        lookup = hidden
        size = recipe.residual * tokens * arch.hidden
        hidden = dropout(sim, lookup, size, tokens * arch.hidden, arch.embed_dropout)
        if not recipe.full:
            leaf = lookup
        elif lookup_local:
            unread += (lookup,)
        else:
            sim.drop(lookup)
    rotary_workspace(sim, recipe, workspace)
    return Inputs(hidden, full, held, forward_held, sliding_mask=sliding, leaf=leaf, unread=unread)


def rotary_workspace(sim: Sim, recipe: TraceRecipe, workspace: int) -> None:
    """The warm-up's first cuBLAS call makes the workspace (``workspace``, 0 once made):
    RoPE's ``inv_freq @ position_ids`` before transformers 5.19 (`TraceRecipe.rotary_matmul`),
    made here, as a model computes its rotary tables; else the first linear's, once its
    output is allocated."""
    if recipe.rotary_matmul and workspace:
        sim.new(workspace)
    else:
        sim.forward_workspace = workspace


def lookup_inputs(
    hidden: int,
    embeds: int,
    recipe: TraceRecipe,
    *,
    masks: tuple[int | None, int | None, tuple[int, ...], tuple[int, ...], tuple[int, ...]],
    ids: int,
    forward_locals: tuple[int, ...] = (),
    step_held: tuple[int, ...] = (),
) -> Inputs:
    """The `Inputs` of a model whose first block reads its token lookup plus learned
    positions (GPT-2's, OPT's; ``masks`` as `layer_masks` returns them): the token lookup
    ``embeds`` is the adapters' leaf, else a local of the forward like
    ``forward_locals``; the position ``ids`` reach every layer; ``step_held``: what the
    backward still reads."""
    full, _, held, forward_held, _ = masks
    return Inputs(
        hidden,
        full,
        (*held, *step_held),
        (*forward_held, ids),
        leaf=None if recipe.full else embeds,
        unread=forward_locals if not recipe.full else (embeds, *forward_locals),
    )


def layer_masks(
    sim: Sim, arch: Arch, recipe: TraceRecipe, *, always: bool = False
) -> tuple[int | None, int | None, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The masks the model makes for its layers: (full-attention layers', sliding layers',
    `Inputs.step_held`, `Inputs.forward_held`, `Inputs.unread`).

    One mask per kind of layer the model has (full attention, sliding window:
    Mistral and Phi-3 slide on every layer, Qwen2 with ``use_sliding_window`` on
    some), or both kinds (`Arch.both_masks`).  Eager: a float mask per sample.
    sdpa: the full-attention layers' is none, but a boolean one for a padded
    batch or, with ``always``, at any length (``create_causal_mask``); the sliding
    layers' is a boolean one once the
    window is no longer than the sequence, or for a padded batch
    (``create_sliding_window_causal_mask``).
    """
    # The kinds of layer (sliding or not) there are; families without the field: full only.
    read = set(arch.sliding_layers) or {False}
    kinds = {False, True} if arch.both_masks else read  # Ministral makes both in any case
    if recipe.attention == "eager":
        if recipe.padded:
            full = eager_mask(sim, recipe, causal_mask(sim, recipe))
        else:
            full = sim.new(recipe.act * recipe.batch * recipe.seq * recipe.seq)
        sliding = sliding_mask(sim, recipe) if kinds == {False, True} else full
        held = ()
    else:  # flash reads the 2-D padding mask and its window as they are: no mask made
        held, full, sliding = (sim.new(4),), None, None
        sdpa = recipe.attention == "fused"
        if sdpa and (recipe.padded or always) and False in kinds:
            full = causal_mask(sim, recipe)
        if sdpa and True in kinds and (window_masked(arch, recipe) or recipe.padded):
            sliding = sliding_mask(sim, recipe)
    masks = {kind: mask for kind, mask in ((False, full), (True, sliding)) if mask is not None}
    # A mask no layer reads is referenced by the model's forward only: it dies as that returns.
    forward_held = tuple(dict.fromkeys(mask for kind, mask in masks.items() if kind in read))
    unread = tuple(mask for mask in masks.values() if mask not in forward_held)
    return full, sliding, held, forward_held, unread


def llama_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
    layer_norm: Callable[[Sim, int, int, int, TraceRecipe], int] = norm,
    self_attention: Callable[..., int] | None = None,
) -> int:
    """Layer ``index`` as Llama's: its kind's mask, RoPE unless it is a NoPE layer, its
    experts if it routes to them; ``layer_norm``: its two norms (Gemma's, in Gemma (1)'s
    layer); ``self_attention``: its attention when not Llama's (GLM's)."""
    mask = inputs.layer_mask(arch, index)
    rotary = inputs.layer_rotary(arch, index)
    routed = arch.is_moe and arch.moe_layers[index]
    return block(
        sim,
        x,
        arch=arch,
        recipe=recipe,
        mask=mask,
        selective=selective,
        rotary=rotary,
        layer_norm=layer_norm,
        self_attention=self_attention,
        feed_forward=moe_mlp if routed else None,
    )


LLAMA = TraceModel(prepare=llama_prepare, block=llama_layer, norm=norm)
# StarCoder2's: Llama's layer and model with LayerNorms.
LAYER_NORMED = TraceModel(
    prepare=llama_prepare,
    block=functools.partial(llama_layer, layer_norm=layer_norm),
    norm=layer_norm,
)


def window_masked(arch: Arch, recipe: TraceRecipe) -> bool:
    """sdpa gets a materialized sliding-window mask: masking_utils skips it (``is_causal``)
    only while the keys are fewer than the window (``_ignore_causal_mask_sdpa``)."""
    return arch.sliding_window is not None and recipe.seq >= arch.sliding_window


def sliding_mask(sim: Sim, recipe: TraceRecipe) -> int:
    """``create_sliding_window_causal_mask``: sdpa's boolean mask (masking_utils.sdpa_mask:
    two comparisons and two ``&``, then the padding's); eager's float one made from it."""
    seq = recipe.seq
    after = sim.new(seq * seq)  # kv_idx > q_idx - window: the sliding overlay
    causal = sim.new(seq * seq)
    sim.drop(after)
    before = sim.new(seq * seq)  # kv_idx <= q_idx: the causal function
    sliding = _padding(sim, recipe, sim.new(seq * seq))
    sim.drop(before, causal)
    return eager_mask(sim, recipe, sliding) if recipe.attention == "eager" else sliding


def causal_mask(sim: Sim, recipe: TraceRecipe) -> int:
    """``create_causal_mask`` of a padded batch: masking_utils.sdpa_mask's ``kv_idx <=
    q_idx``, anded with the padding's (unpadded, sdpa needs none, and the replay makes
    eager's float mask at once)."""
    seq = recipe.seq
    before = sim.new(seq * seq)
    causal = sim.new(seq * seq)
    sim.drop(before)
    return _padding(sim, recipe, causal)


def bidirectional_mask(sim: Sim, recipe: TraceRecipe) -> int | None:
    """``create_bidirectional_mask`` (BERT's): none without padding, nor for flash, which
    reads the 2-D padding mask; else masking_utils.sdpa_mask's ``q_idx >= 0`` anded with
    the padding's, a boolean mask per sample, made a float one for eager."""
    if not recipe.padded or recipe.attention == "flash":
        return None
    mask = _padding(sim, recipe, sim.new(recipe.seq))
    return eager_mask(sim, recipe, mask) if recipe.attention == "eager" else mask


def _padding(sim: Sim, recipe: TraceRecipe, mask: int) -> int:
    """masking_utils' ``padding_mask_function`` (``padding_mask[batch_idx, kv_idx]``)
    anded in: a padded batch's mask is per sample."""
    if not recipe.padded:
        return mask
    rows = sim.new(recipe.batch * recipe.seq)
    padded = sim.new(recipe.batch * recipe.seq * recipe.seq)
    sim.drop(mask, rows)
    return padded


def eager_mask(sim: Sim, recipe: TraceRecipe, boolean: int) -> int:
    """masking_utils.eager_mask: the boolean mask turned into a float one per sample."""
    out = sim.new(recipe.act * recipe.batch * recipe.seq * recipe.seq)
    sim.drop(boolean)
    return out


def head_and_loss(
    sim: Sim,
    hidden: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    model: TraceModel,
    inputs: Inputs,
    loss_in_dtype: bool,
) -> tuple[int, int]:
    """From the last block's output ``hidden``: the final norm, the base model's return,
    the LM head and the loss; returns (loss, logits).  ``loss_in_dtype``: the loss takes
    the logits as they are (BERT's CrossEntropyLoss), not upcast (a causal LM's)."""
    tokens = recipe.batch * recipe.seq
    normed = model.norm(sim, hidden, tokens, arch.hidden, recipe)
    # The base model's forward returns: its locals die.  Its output lives until the loss:
    # a final norm's, or the last block's when `norm` is the head's (BERT's transform).
    output = hidden if model.norm_in_head else normed
    sim.drop(*inputs.unread, *inputs.returned)
    if output != hidden:
        sim.drop(hidden)
    vocab = tokens * arch.vocab
    head_bytes = recipe.logits or recipe.act
    logits = sim.op(
        [normed],
        head_bytes * vocab,
        save=[normed] if recipe.full else [],
        param_grad=recipe.weights * arch.vocab * arch.hidden if recipe.full else 0,
        matmul=True,
        input_grad_first=arch.head_bias,  # `addmm`'s backward
    )
    if output != normed:  # `hidden_states = self.decoder(hidden_states)`
        sim.drop(normed)
    # GraniteForCausalLM: `logits / self.config.logits_scaling`; CohereForCausalLM:
    # `logits * self.logit_scale`.
    if arch.scalar_multipliers or arch.logit_scale:
        logits = scaled(sim, logits, head_bytes * vocab)
    if arch.final_softcap:  # Gemma2ForCausalLM.forward caps the logits before the loss
        logits = softcap(sim, logits, head_bytes * vocab)
    loss_bytes = head_bytes if loss_in_dtype else 4
    upcast = sim.op([logits], loss_bytes * vocab) if head_bytes != loss_bytes else logits
    log_softmax = sim.op([upcast], loss_bytes * vocab, save_out=True)
    if upcast != logits:
        sim.drop(upcast)
    loss = sim.op([log_softmax], 4, save=[log_softmax])
    sim.drop(log_softmax)
    # LlamaForCausalLM.forward computes the loss before it returns: its local
    # `hidden_states` (and `outputs.last_hidden_state`), the final norm's output, dies then.
    sim.drop(output, *inputs.until_loss)
    if not recipe.logits:
        sim.drop(logits, *inputs.returned_outputs)
    return loss, logits
