"""What a decoder's MLP keeps: dense gated MLPs, routed experts, shared experts and
PEFT's adapters on stacked experts.

`ckpt_core._memory.families.decoder` composes these into its block ledger and
parameter layout.  Routed experts are transformers' grouped_mm experts over
tokens x top_k rows (Mixtral, the Qwen MoEs, OLMoE, GLM-4.5, DeepSeek-V3; gpt-oss with its
clamped SwiGLU); on transformers 5, PEFT adapts their stacked weights and the
router for the names of the linear modules they replaced (`adapted_experts`).
Pure arithmetic.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.ledger import Ledger, Step, activation, linear
from ckpt_core._memory.moe_trace import expert_parameters, shared_module
from ckpt_core._memory.param_layout import AdaptedParameter

# Model types whose LoRA targets PEFT (0.21, on transformers 5) maps onto the stacked
# experts and the router (transformers_weight_conversion's MoE mapping), with the names of
# the modules they replaced: gate and up (fused into gate_up_proj), then down.
_PEFT_EXPERT_TARGETS: dict[str, tuple[str, str, str]] = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
    "olmoe": ("gate_proj", "up_proj", "down_proj"),
    "glm4_moe": ("gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("gate_proj", "up_proj", "down_proj"),
    "deepseek_v2": ("gate_proj", "up_proj", "down_proj"),
    "dots1": ("gate_proj", "up_proj", "down_proj"),
    "glm4_moe_lite": ("gate_proj", "up_proj", "down_proj"),
}


def adapted_experts(arch: Arch, layers: int) -> tuple[AdaptedParameter, ...]:
    """The experts' gate_up_proj and down_proj, and the router's weight, as PEFT adapts
    them in each of the ``layers`` MoE layers."""
    names = _PEFT_EXPERT_TARGETS.get(arch.model_type)
    if names is None or not layers:
        return ()
    gate, up, down = names
    targets = ((gate, up), (down,), ("gate",))  # expert_parameters' order
    return tuple(
        AdaptedParameter(name, replaced, experts, fan_in, fan_out, layers)
        for (name, experts, fan_in, fan_out), replaced in zip(
            expert_parameters(arch), targets, strict=True
        )
    )


def glu_mlp(
    led: Ledger, arch: Arch, step: Step, x: str, *, module: str = "mlp", inter: int = 0
) -> None:
    """down(act(gate(x)) * up(x)) of ``module`` (``inter`` wide, the config's intermediate
    size unless given); Phi-3 fuses gate and up into one projection."""
    elem_bytes, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    inter = inter or arch.intermediate
    elements = tokens * inter
    if arch.fused_gate_up:
        linear(led, step, x, h, f"{module}.gate_up_proj")
        led.keep(f"{module}.gate_up", 2 * elem_bytes * elements)  # gate and up are views of it
        gate, up = f"{module}.gate_up", f"{module}.gate_up"
    else:
        linear(led, step, x, h, f"{module}.gate_proj")
        linear(led, step, x, h, f"{module}.up_proj")
        gate, up = f"{module}.gate", f"{module}.up"
    act = activation(led, step, gate, tag=f"{module}.act", kind=arch.act, elements=elements)
    led.keep(act, elem_bytes * elements)  # the product keeps both factors
    led.keep(up, elem_bytes * elements)
    linear(led, step, f"{module}.product", inter, f"{module}.down_proj")


def routed_mlp(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """Router + transformers' grouped_mm experts over tokens x top_k rows; PEFT's adapters
    on them (`_adapted_weights`)."""
    elem_bytes, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    rows, inter, experts = tokens * arch.top_k, arch.moe_intermediate, arch.experts
    trained = step.trainable_weights
    if trained or step.adapted("mlp.gate.weight"):  # the router's weight gradient
        if arch.fp32_router and elem_bytes != 4:  # GLM-4.5's and DeepSeek's cast x to fp32
            led.keep("router.in", 4 * tokens * h)
        else:
            led.keep(x, elem_bytes * tokens * h)
    led.keep("router.softmax", 4 * tokens * experts)
    if arch.router_group_mask:
        led.keep("router.group_mask", tokens * experts)
    led.keep("router.top_index", 8 * rows)
    if arch.norm_topk:  # `router_top_value /= router_top_value.sum(...)` keeps both
        led.keep("router.top_sum", 4 * tokens)
        led.keep("router.top_value", 4 * rows)
    for name in ("experts.perm", "experts.token_index", "experts.inverse_perm"):
        led.keep(name, 8 * rows)
    led.keep("experts.offsets", 4 * experts)
    if trained or step.adapted("mlp.experts.gate_up_proj"):
        led.keep("experts.selected", elem_bytes * rows * h)
    led.keep("experts.gate_up", 2 * elem_bytes * rows * inter)
    led.keep("experts.act", elem_bytes * rows * inter)
    if trained or step.adapted("mlp.experts.down_proj"):
        led.keep("experts.product", elem_bytes * rows * inter)
    led.keep("experts.down", elem_bytes * rows * h)
    led.keep("experts.weights", (elem_bytes if arch.router_in_dtype else 4) * rows)
    if arch.shared_expert_intermediate:
        _shared_expert(led, arch, step, x)
    _adapted_weights(led, arch, step)


def _adapted_weights(led: Ledger, arch: Arch, step: Step) -> None:
    """PEFT's adapters on the stacked experts and the router (`AdaptedParameter`).

    Each adapted weight is parametrized for the forward: the experts' ``W +
    scaling * lhs @ rhs`` (one ``baddbmm``, in the weight's dtype, from the factors
    cast to it: copies when the fp32 adapters are not in that dtype, which it keeps),
    the router's ``W + delta``; the matmul keeps that whole new weight for its input's
    gradient.  The experts' weights are in the residual stream's dtype (fp32 after
    kbit preparation or under autocast)."""
    weight_bytes, rank = step.residual_bytes, step.lora_rank
    h, inter, experts = arch.hidden, arch.moe_intermediate, arch.experts
    stacked = (("gate_up_proj", h, 2 * inter, 2 * rank), ("down_proj", inter, h, rank))
    for name, fan_in, fan_out, factor_rank in stacked:
        if step.adapted(f"mlp.experts.{name}"):
            led.keep(f"experts.{name}.weight", weight_bytes * experts * fan_in * fan_out)
            if weight_bytes != 4:
                factors = weight_bytes * experts * factor_rank * (fan_in + fan_out)
                led.keep(f"experts.{name}.factors", factors)
    if step.adapted("mlp.gate.weight"):  # GLM-4.5's router weight is fp32
        led.keep("router.weight", (4 if arch.fp32_router else weight_bytes) * experts * h)


def _shared_expert(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """GLM-4.5 adds its shared experts' MLP as it is; Qwen2-MoE scales it,
    ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``: the sigmoid keeps its output,
    which the product keeps with the shared MLP's output."""
    elem_bytes, tokens = step.dtype_bytes, step.tokens
    inter = arch.shared_expert_intermediate
    glu_mlp(led, arch, step, x, module=shared_module(arch), inter=inter)
    if not arch.shared_expert_gate:
        return
    linear(led, step, x, arch.hidden, "mlp.shared_expert_gate")
    led.keep("mlp.shared_expert_gate.sigmoid", elem_bytes * tokens)
    led.keep("mlp.shared_expert.out", elem_bytes * tokens * arch.hidden)


def clamped_routed_mlp(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """gpt-oss's MLP: a biased router's top-k logits, softmaxed in the dtype, then
    transformers' grouped_mm experts with gathered biases and its clamped SwiGLU
    (``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``, ``gate * sigmoid(gate *
    alpha)``, ``(up + 1) * glu``: each product keeps its factors)."""
    elem_bytes, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    rows, inter = tokens * arch.top_k, arch.moe_intermediate
    trained = step.trainable_weights
    if trained:
        led.keep(x, elem_bytes * tokens * h)  # the router's weight gradient
    led.keep("router.top_index", 8 * rows)
    led.keep("router.top_softmax", elem_bytes * rows)
    for name in ("experts.token_index", "experts.perm", "experts.inverse_perm"):
        led.keep(name, 8 * rows)
    if trained:  # the biases' gather keeps the sorted expert ids
        led.keep("experts.sorted_ids", 8 * rows)
        led.keep("experts.selected", elem_bytes * rows * h)
    led.keep("experts.offsets", 4 * arch.experts)
    led.keep("experts.gate_up", 2 * elem_bytes * rows * inter)  # the clamps keep its halves
    for name in ("gate_clamped", "sigmoid", "glu", "up_plus_one"):
        led.keep(f"experts.{name}", elem_bytes * rows * inter)
    if trained:
        led.keep("experts.product", elem_bytes * rows * inter)
    led.keep("experts.down", elem_bytes * rows * h)
    led.keep("experts.weights", elem_bytes * rows)
