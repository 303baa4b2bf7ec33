"""The request bodies' cross-field rules, as JSON Schema: what ckpt_core refuses.

`service.schemas` puts them into its models' documents (``allOf`` / ``anyOf`` /
``not``), so a client, the OpenAPI document and the fuzz test see the same rules
that ckpt_core's own checks enforce, with their messages and fields, at run time.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_core import ESTIMATE_FAMILIES, MOE_MODEL_TYPES, OPTIMIZERS, list_presets, load_preset
from service.contract import Allowed, Choice, combinations

# Cross-field rules: the combinations ckpt_core refuses, stated as the ones it takes.
# Each group lists what it allows, one branch a case; the rules that share a field
# are one anyOf of the product of their groups.  Stated as an allOf of anyOf
# clauses instead, schemathesis' generator (jsonschema_rs' canonical form) gives up
# past ~50 intersections ("outgrew_intersections"); the product is 6 and 16 cases.
PRECISION: Final = combinations(
    # qlora trains adapters over quantized weights; a full fine-tune cannot train them.
    [
        Allowed(required=("method",), method={"qlora"}, weights={"nf4", "int8"}),
        Allowed(required=("method",), method={"lora"}),
        Allowed(method={"full"}, weights={"bf16", "fp16", "fp32"}),
    ],
    # autocast keeps fp32 master weights (or quantized ones) and computes in a half dtype.
    [
        Allowed(compute={"loaded"}),
        Allowed(
            required=("compute",),
            compute={"autocast"},
            dtype={"bf16", "fp16"},
            weights={"fp32", "nf4", "int8"},
        ),
    ],
    nullable={"weights"},
)
SHARDING: Final = combinations(
    # ZeRO-1 and optimizer-only offload are DeepSpeed's; offload needs sharding;
    # offloading everything needs zero3.
    [
        Allowed(offload={"none"}, engine={"torch"}, sharding={"none", "zero2", "zero3"}),
        Allowed(required=("engine",), offload={"none"}, engine={"deepspeed"}),
        Allowed(
            required=("offload", "engine", "sharding"),
            offload={"optimizer"},
            engine={"deepspeed"},
            sharding={"zero1", "zero2", "zero3"},
        ),
        Allowed(required=("offload", "sharding"), offload={"all"}, sharding={"zero3"}),
    ],
    # Hybrid sharding shards within a node of gpus_per_node GPUs, with zero3.
    [
        Allowed(hybrid={"const": False}),
        Allowed(
            required=("hybrid", "gpus_per_node", "sharding"),
            hybrid={"const": True},
            gpus_per_node={"type": "integer"},
            sharding={"zero3"},
        ),
    ],
    # Adafactor's states are modelled on whole parameters: one GPU or DDP.
    [
        Allowed(optimizer=set(OPTIMIZERS) - {"adafactor"}),
        Allowed(
            required=("optimizer",), optimizer={"adafactor"}, engine={"torch"}, sharding={"none"}
        ),
    ],
)
# A measurement has no engine field: the engine is torch, which has no ZeRO-1.
MEASURABLE_SHARDING: Final = {
    "not": {"required": ["sharding"], "properties": {"sharding": Choice(["zero1"]).schema()}}
}


# Presets whose families learn absolute positions: a longer sequence is refused
# (by ckpt_core, for the estimate and the measurement).  A test checks this table
# against ckpt_core for every preset.
LEARNED_POSITION_KEYS: Final = {"gpt2": "n_positions", "bert": "max_position_embeddings"}


def learned_positions() -> dict[str, int]:
    """Preset name -> the longest sequence its learned positions allow."""
    limits = {}
    for preset in list_presets():
        key = LEARNED_POSITION_KEYS.get(preset.model_type)
        if key is not None:
            limits[preset.name] = int(load_preset(preset.name)[key])
    return limits


def not_beyond_positions(shape: str) -> dict[str, Any]:
    """``not`` (a preset with learned positions and a longer `shape`.seq_len)."""
    return {
        "allOf": [
            {
                "not": {
                    "required": ["model", shape],
                    "properties": {
                        "model": {
                            "required": ["preset"],
                            "properties": {"preset": Choice([name]).schema()},
                        },
                        shape: {
                            "type": "object",
                            "required": ["seq_len"],
                            "properties": {"seq_len": {"type": "integer", "minimum": limit + 1}},
                        },
                    },
                }
            }
            for name, limit in learned_positions().items()
        ]
    }


def no_adafactor_on_experts() -> dict[str, Any]:
    """``not`` (optimizer adafactor with a model whose layers have experts: a preset, or a
    config of one of `MOE_MODEL_TYPES`)."""
    experts = [preset.name for preset in list_presets() if preset.model_type in MOE_MODEL_TYPES]
    return {
        "not": {
            "required": ["model", "workload"],
            "properties": {
                "workload": {
                    "required": ["optimizer"],
                    "properties": {"optimizer": Choice(["adafactor"]).schema()},
                },
                "model": {
                    "anyOf": [
                        {
                            "required": ["preset"],
                            "properties": {"preset": Choice(experts).schema()},
                        },
                        {
                            "required": ["config"],
                            "properties": {
                                "config": {
                                    "required": ["model_type"],
                                    "properties": {"model_type": {"enum": sorted(MOE_MODEL_TYPES)}},
                                }
                            },
                        },
                    ]
                },
            },
        }
    }


# Both a GPU name and a GPU memory: ckpt_core refuses the pair.
NOT_GPU_AND_MEMORY = {
    "not": {
        "required": ["gpu", "gpu_memory_gb"],
        "properties": {"gpu": {"type": "string"}, "gpu_memory_gb": {"type": "number"}},
    }
}


# The estimate has a memory model for these model types only.
ESTIMATED_MODEL_TYPES: Final = {
    "properties": {
        "model": {
            "properties": {
                "config": {
                    "required": ["model_type"],
                    "properties": {"model_type": {"enum": sorted(ESTIMATE_FAMILIES)}},
                }
            }
        }
    }
}
