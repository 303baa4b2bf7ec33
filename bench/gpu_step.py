"""One real training step on a CUDA GPU, recorded as a row in the shared rows' schema.

Run: ``.venv/bin/python -m bench.gpu_step --model llama-3.2-1b --tier full --seq-len 1024
--batch 2 --method qlora --attention eager --out bench/data/<file>.json``.

Builds the model from its config with random weights (no download: the
weights are saved to a temporary folder and loaded back with
``from_pretrained``, so quantization goes through transformers' and
bitsandbytes' own loading path; ``--load-path to_device`` loads on the CPU and
moves the model with ``.to()`` instead of a device map), applies the recipe the
estimate describes (QLoRA: ``BitsAndBytesConfig`` nf4, or 8-bit with
``--quantization int8``, PEFT's ``prepare_model_for_kbit_training``;
LoRA through ``get_peft_model`` on the attention's projections, adapters fp32,
``lora_alpha = 2r``, dropout 0; ``--method full`` trains every parameter), the
tier with this project's hooks (``--hooks project``) or HF's native
checkpointing (``--hooks hf``, full only), then runs ``--warmup`` steps and one
measured step: ``zero_grad(set_to_none=True)``, ``out = model(input_ids=x,
labels=x, use_cache=False)`` (a multimodal model's text config keeps its own
``use_cache``; an encoder-decoder's decoder reads ``decoder_input_ids=x``, as from a
seq2seq collator; ``--padded`` adds an ``attention_mask`` that pads each row's last
token), ``out.loss.backward()``, ``optimizer.step()`` (torch AdamW on the
trainable parameters: its foreach step, or ``--optimizer adamw_fused``).  It
appends one row (measured fields plus the estimate's prediction) to ``--out``,
which ``bench/gpu_truth.py`` scores.  The model is the class the estimate describes
(`ckpt_core._configs.model_config.model_class`): a causal LM, BERT's masked LM, T5's
seq2seq LM.
Without CUDA it exits with status 3 and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final

from bench._common import attention_targets
from bench._gpu_rows import BLOCKS, full_blocks

MIB: Final = 1 << 20
NO_CUDA: Final = 3
BAD_TIER: Final = 2  # argparse's status for bad arguments
TIERS: Final = ("off", "selective", "medium", "full")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a bundled preset or a config.json path")
    parser.add_argument(
        "--tier",
        type=_tier,
        default="full",
        help=f"{' | '.join(TIERS)} | {BLOCKS}K (K whole blocks checkpointed, placed as auto does)",
    )
    parser.add_argument("--hooks", choices=("project", "hf"), default="project")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="bf16")
    parser.add_argument("--method", choices=("full", "lora", "qlora"), default="lora")
    parser.add_argument(
        "--quantization",
        choices=("nf4", "int8"),
        default="nf4",
        help="qlora's bitsandbytes weights: 4-bit nf4, or 8-bit (LLM.int8)",
    )
    parser.add_argument("--double-quant", action="store_true")
    parser.add_argument("--lora-rank", type=int, help="LoRA's rank (32)")
    parser.add_argument(
        "--lora-targets", help="comma-separated module names (the attention's projections)"
    )
    parser.add_argument("--attention", choices=("eager", "sdpa"), default="sdpa")
    parser.add_argument(
        "--optimizer",
        choices=("adamw", "adamw_fused"),
        default="adamw",
        help="torch.optim.AdamW's foreach step, or fused=True",
    )
    parser.add_argument(
        "--load-path",
        choices=("device_map", "to_device"),
        default="device_map",
        help="from_pretrained(device_map=...), or loaded on the CPU and moved with .to()",
    )
    parser.add_argument(
        "--padded", action="store_true", help="an attention mask that pads each row's last token"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="JSON rows file (appended)")
    parser.add_argument(
        "--weights", type=Path, help="folder for the random weights, reused when present"
    )
    args = parser.parse_args(argv)
    if args.method != "qlora" and args.quantization != "nf4":
        parser.error("--quantization applies to --method qlora")
    if args.method == "qlora" and args.load_path == "to_device":
        parser.error("--method qlora is quantized while it loads: only --load-path device_map")
    if args.hooks == "hf" and args.tier != "full":
        parser.error("--hooks hf checkpoints every block: only --tier full")
    if args.method == "full" and (args.lora_rank is not None or args.lora_targets is not None):
        parser.error("--method full trains every parameter: no --lora-rank or --lora-targets")
    if args.method != "full" and args.lora_rank is None:
        args.lora_rank = 32
    for name in ("seq_len", "batch", "lora_rank", "warmup"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def _tier(value: str) -> str:
    if value in TIERS or (value.startswith(BLOCKS) and value.removeprefix(BLOCKS).isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not {', '.join(TIERS)} or {BLOCKS}K")


def model_input(spec: str) -> dict[str, Any]:
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        return {"config": json.loads(path.read_text())}
    return {"preset": spec}


def lora_targets_of(args: argparse.Namespace, config: dict[str, Any]) -> list[str] | None:
    """The modules LoRA adapts: ``--lora-targets``, else the model type's attention
    projections; None for a full fine-tune."""
    if args.method == "full":
        return None
    if args.lora_targets is not None:
        return args.lora_targets.split(",")
    return attention_targets(config["model_type"])


def model_config_of(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The shared rows' ``model_config``, from the estimate's reading of the HF config
    (so that every family's config, whatever it names its sizes, gives the same keys)."""
    from ckpt_core._memory.inputs import model_facts

    arch = model_facts({"config": config}).arch
    return {
        "name": name,
        "model_type": config["model_type"],
        "hidden_size": arch.hidden,
        "num_layers": arch.encoder_layers + arch.layers,
        "num_attention_heads": arch.heads,
        "num_kv_heads": arch.kv_heads,
        "intermediate_size": arch.intermediate,
        "vocab_size": arch.vocab,
        "head_dim": arch.head_dim,
        "tie_word_embeddings": arch.tied,
    }


def build_row(
    args: argparse.Namespace,
    config: dict[str, Any],
    measured: dict[str, Any],
    gpu: str,
    versions: dict[str, str],
) -> dict[str, Any]:
    """One row: the run, what the GPU measured, and the estimate's prediction for it."""
    from bench._gpu_rows import estimate_row

    adapters = "" if args.method == "full" else f" r={args.lora_rank}"
    row: dict[str, Any] = {
        "model_id": args.model,
        "gpu": gpu,
        "config": f"{args.method}"
        + (f" {args.quantization}" if args.method == "qlora" else "")
        + f"{adapters} bs={args.batch} seq={args.seq_len} "
        f"{args.dtype} {args.attention} tier={args.tier} hooks={args.hooks}"
        + (" padded" if args.padded else ""),
        "run": {
            "kernel": "eager" if args.attention == "eager" else "flash",
            "attn_impl": args.attention,
            "seq_len": args.seq_len,
            "batch_size": args.batch,
            "precision": args.dtype,
            "quantization": args.quantization if args.method == "qlora" else "none",
            "double_quant": args.double_quant,
            "padded": args.padded,
            "load_path": args.load_path,
            "optimizer": args.optimizer,
            "optimizer_dtype": args.dtype,  # torch's AdamW keeps its states in the parameters'
            "method": args.method,
            "lora_rank": args.lora_rank,
            "lora_targets": lora_targets_of(args, config),
            "grad_checkpoint": args.tier != "off",
            "tier": args.tier,
            "hooks": args.hooks,
            "model_type": config["model_type"],
            "gpu_name": gpu,
            **versions,
        },
        "measured": measured,
        "model_config": model_config_of(config, Path(args.model).stem),
        "hf_config": config,  # what the estimate reads back (sliding windows, norms, ...)
    }
    estimate = estimate_row(row)
    row["predicted"] = {
        "allocated_mib": estimate["allocated_bytes"] / MIB,
        "process_mib": estimate["peak_bytes"] / MIB,
    }
    return row


def append_row(path: Path, row: dict[str, Any]) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {"_provenance": "", "runs": []}
    data["_provenance"] = "rows recorded by bench/gpu_step.py (this project), one step each"
    data["runs"].append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ckpt_core._configs.model_config import load_model_config

    config = dict(load_model_config(model_input(args.model)).config)
    if args.tier.startswith(BLOCKS):
        try:
            block_plan_of(args.tier, config)
        except ValueError as exc:
            print(f"gpu_step.py: --tier {exc}", file=sys.stderr)
            return BAD_TIER
    if not torch.cuda.is_available():
        print("gpu_step.py needs a CUDA GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return NO_CUDA
    weights = tempfile.TemporaryDirectory() if args.weights is None else nullcontext(args.weights)
    with weights as folder:
        measured, versions = _measure_step(args, config, Path(folder))
    gpu = torch.cuda.get_device_name()
    append_row(args.out, build_row(args, config, measured, gpu, versions))
    print(json.dumps(measured, indent=1))
    return 0


def saved_random_weights(config: dict[str, Any], folder: Path, dtype: Any) -> Path:
    """A folder holding the model with random weights, built and saved there when absent.

    Loading goes through ``from_pretrained`` so that quantization takes transformers'
    and bitsandbytes' own path; a sweep builds each model once and reuses the folder.
    """
    from ckpt_core._configs.model_config import hf_config_from_dict

    if not (folder / "config.json").is_file():
        random = _model_class(config)(hf_config_from_dict(config)).to(dtype)
        random.save_pretrained(folder)
    return folder


def _model_class(config: dict[str, Any]) -> Any:
    """The transformers class the estimate describes for ``config``."""
    from ckpt_core._configs.model_config import load_model_config, model_class

    return model_class(load_model_config({"config": config}))


def prepared_model(
    args: argparse.Namespace, config: dict[str, Any], weights: Path, device: str
) -> Any:
    """The model with the recipe and the tier applied, on ``device``, in training mode."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    from ckpt_core import install_checkpoint_hooks

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": args.attention}
    if args.method == "qlora" and args.quantization == "int8":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    elif args.method == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=args.double_quant,
        )
    folder = saved_random_weights(config, weights, dtype)
    cls = _model_class(config)
    if args.load_path == "device_map":
        model = cls.from_pretrained(folder, device_map=device, **kwargs)
    else:
        model = cls.from_pretrained(folder, **kwargs).to(device)
    if args.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if args.method != "full":
        lora = LoraConfig(
            r=args.lora_rank,
            lora_alpha=2 * args.lora_rank,
            lora_dropout=0.0,
            target_modules=lora_targets_of(args, config),
        )
        model = get_peft_model(model, lora)
        model.enable_input_require_grads()
    if args.hooks == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif args.tier.startswith(BLOCKS):
        install_checkpoint_hooks(model, "blocks", block_plan=block_plan_of(args.tier, config))
    elif args.tier != "off":
        install_checkpoint_hooks(model, args.tier)
    model.train()
    return model


def block_plan_of(tier: str, config: dict[str, Any]) -> Any:
    """The blocks a ``blocks:K`` tier checkpoints in this model (ValueError for a K it
    cannot have)."""
    from ckpt_core._memory.inputs import model_facts
    from ckpt_core._memory.placement import place

    arch = model_facts({"config": config}).arch
    return place(arch, full_blocks(arch, tier))


def training_step(model: Any, optimizer: Any, ids: Any, mask: Any = None) -> float:
    """One step as the shared rows ran it (``mask``: a padded batch's); returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    decoder = {"decoder_input_ids": ids} if model.config.is_encoder_decoder else {}
    out = model(input_ids=ids, labels=ids, attention_mask=mask, use_cache=False, **decoder)
    out.loss.backward()
    optimizer.step()
    return float(out.loss.detach())


def padding_mask(ids: Any) -> Any:
    """An attention mask that pads the last token of every row."""
    import torch

    mask = torch.ones_like(ids)
    mask[:, -1] = 0
    return mask


def _measure_step(
    args: argparse.Namespace, config: dict[str, Any], weights: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """Build, prepare, warm up and measure one step on the current CUDA device."""
    import peft
    import torch
    import transformers

    model = prepared_model(args, config, weights, "cuda")
    resident = torch.cuda.memory_allocated()  # weights + adapters, as the shared rows
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, fused=args.optimizer == "adamw_fused")
    ids = torch.randint(0, config["vocab_size"], (args.batch, args.seq_len), device="cuda")
    mask = padding_mask(ids) if args.padded else None
    for _ in range(args.warmup):
        training_step(model, optimizer, ids, mask)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    training_step(model, optimizer, ids, mask)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.max_memory_reserved()
    context = total - free - torch.cuda.memory_reserved()
    measured = {
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
        "peak_reserved_mib": reserved / MIB,
        "cuda_context_mib": context / MIB,
        "process_mib": (reserved + context) / MIB,
        "resident_before_step_mib": resident / MIB,
        "trainable_params": sum(p.numel() for p in trainable),
        # The pool the step left, segment by segment in address order: where a reserved
        # peak differs from the replay's, which segment the replay made that the GPU did not.
        "segments_mib": [
            segment["total_size"] / MIB
            for segment in sorted(torch.cuda.memory_snapshot(), key=lambda s: s["address"])
        ],
    }
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    return measured, versions


if __name__ == "__main__":
    raise SystemExit(main())
