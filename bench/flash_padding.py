"""Flash attention with a padded batch: the closed form against transformers' own path.

With a padding mask, transformers' ``_flash_attention_forward`` gathers the real
tokens of q, k and v for the varlen kernel and scatters its output back into a
new padded tensor (``modeling_flash_attention_utils._upad_input`` /
``_pad_input``), so the kernel saves the gathered copies and o_proj reads
another tensor than the kernel's output.  No flash kernel runs on CPU, so the
measurement sets the module's lazily loaded kernel functions to a stand-in
that saves what a fused kernel saves (q, k, v, output, log-sum-exp): every
other op is transformers' own, on real CPU tensors (the unpadding reads the
mask's values, which meta tensors do not have).  Each case is a small model of
a family's shape (two layers), micro-batch 2, seq 256, its first row's last
token padded; it prints the bytes autograd keeps at the end of the forward
(`ckpt_core._meta.measure`'s definition) next to the closed form's, as ratios.

Run: ``.venv/bin/python -m bench.flash_padding``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

import torch

SEQ: Final = 256
BATCH: Final = 2
# (name, preset whose config is shrunk): q / k norms, fused projections, post-norms.
FAMILIES: Final = (
    ("llama", "llama-3.2-1b"),
    ("qwen3", "qwen3-8b"),
    ("phi3", "phi-3-mini"),
    ("olmo2", "olmo-2-7b"),
)
SMALL: Final = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
PROBE: Final = "ckpt_core_flash_probe"


def small_config(preset: str) -> dict[str, Any]:
    from ckpt_core._configs.presets import load_preset

    return {**load_preset(preset), **SMALL}


def measured_bytes(config: dict[str, Any], method: str, padded: bool) -> int:
    """What autograd keeps at the end of one training forward through transformers'
    flash path (stand-in kernels), for a full fine-tune or LoRA on every linear."""
    from transformers import AutoModelForCausalLM

    from ckpt_core._configs.model_config import hf_config_from_dict
    from ckpt_core._meta.measure import _kept_bytes
    from ckpt_core._planning.workload import Workload

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_from_dict(config)).to(torch.bfloat16)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
        model.enable_input_require_grads()
    model.train()
    shape = Workload(
        seq_len=SEQ, micro_batch_size=BATCH, attention="flash_attention_2", padded=padded
    )
    with _flash_probe(model):
        return _kept_bytes(model, shape)


def estimated_bytes(config: dict[str, Any], method: str, padded: bool) -> int:
    from ckpt_core._memory.activations import activation_bytes
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare

    workload = {
        "seq_len": SEQ,
        "micro_batch_size": BATCH,
        "attention": "flash_attention_2",
        "padded": padded,
        "method": method,
        "lora_rank": 8,
    }
    run = prepare(model_facts({"config": config}), parse_workload(workload))
    return activation_bytes(run.facts.arch, run.step, "off")


class _Kernel(torch.autograd.Function):
    """Saves what a fused attention kernel saves; its values are never read."""

    @staticmethod
    def forward(ctx: Any, query: Any, key: Any, value: Any) -> Any:
        out = torch.empty_like(query)
        lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors[:3])


def _kernel(query: Any, key: Any, value: Any, **_: Any) -> Any:
    return _Kernel.apply(query, key, value)


@contextlib.contextmanager
def _flash_probe(model: Any) -> Iterator[None]:
    """Route the model's attention through transformers' flash path with `_Kernel`."""
    import transformers.modeling_flash_attention_utils as flash
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import flash_attention_mask

    AttentionInterface.register(PROBE, flash_attention_forward)
    AttentionMaskInterface.register(PROBE, flash_attention_mask)
    names = ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_pad_fn", "_unpad_fn")
    names += ("_flash_with_kvcache_fn", "_process_flash_kwargs_fn")
    saved = {name: getattr(flash, name) for name in names}
    patched = (PROBE, _kernel, _kernel, flash._pad_input, flash._unpad_input, None, dict)
    for name, value in zip(names, patched, strict=True):
        setattr(flash, name, value)
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    implementation, config._attn_implementation = config._attn_implementation, PROBE
    try:
        yield
    finally:
        config._attn_implementation = implementation
        for name, value in saved.items():
            setattr(flash, name, value)


def main() -> None:
    print("| model (2 layers, hidden 256) | method | padded | kept bytes | estimate | ratio |")
    print("|---|---|---|--:|--:|--:|")
    for name, preset in FAMILIES:
        config = small_config(preset)
        for method in ("full", "lora"):
            for padded in (False, True):
                measured = measured_bytes(config, method, padded)
                estimated = estimated_bytes(config, method, padded)
                print(
                    f"| {name} | {method} | {padded} | {measured:,} | {estimated:,} "
                    f"| {estimated / measured:.4f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
