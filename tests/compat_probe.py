"""Run in a subprocess under a given transformers release (PYTHONPATH).

For each tier's kwargs (JSON on argv[1]) build real ``TrainingArguments``,
train a tiny Llama for one step with the HF ``Trainer``, and report which
decoder layers HF checkpointed and any FutureWarning.  Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings


def probe(kwargs: dict) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (8,))
    dataset = [{"input_ids": ids, "labels": ids} for _ in range(2)]
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            args = TrainingArguments(
                output_dir=out,
                max_steps=1,
                per_device_train_batch_size=2,
                report_to=[],
                save_strategy="no",
                use_cpu=True,
                **kwargs,
            )
            Trainer(model=model, args=args, train_dataset=dataset).train()
        except (TypeError, ValueError) as error:  # a kwarg this release does not know
            return {"error": f"{type(error).__name__}: {error}"}
    layers = [i for i, layer in enumerate(model.model.layers) if layer.gradient_checkpointing]
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return {"checkpointed_layers": layers, "future_warnings": future}


def main() -> None:
    import transformers

    cases = json.loads(sys.argv[1])
    results = {name: probe(kwargs) for name, kwargs in cases.items()}
    print(json.dumps({"version": transformers.__version__, "results": results}))


if __name__ == "__main__":
    main()
