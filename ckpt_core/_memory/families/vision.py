"""Vision towers of vision-language models: loaded with the text model, never run.

Gemma 3 (a SigLIP tower without head, and a bare projection matrix) and
Mistral 3 (a Pixtral tower, and a projector with a patch merger): their sizes
read from the composite config, their parameter tensors in module order (the
step replay loads them; text-only training gives them no gradient and no
optimizer state) and their linears, which an adapter target matching by
suffix reaches too (PEFT).  Used by the decoder family.  Pure arithmetic.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch, Vision, read_int
from ckpt_core._memory.param_layout import Linear

# Vision-language model types: (their vision tower's model_type, their text models').
MULTIMODAL: Final = {
    "gemma3": ("siglip_vision_model", ("gemma3_text",)),
    "mistral3": ("pixtral", ("mistral", "ministral3")),
}


def read_vision(config: Any) -> Vision:
    """The vision tower's sizes from a vision-language config (`MULTIMODAL`), whose text
    model must be one the decoder family describes for it."""
    text_types = MULTIMODAL[config.model_type][1]
    if getattr(config.get_text_config(), "model_type", None) not in text_types:
        raise ModelConfigError(
            f"a {config.model_type} model is described with a {' or '.join(text_types)} text model",
            field="model.config.text_config",
        )
    vision = config.vision_config
    tower = getattr(vision, "model_type", None)
    if tower != MULTIMODAL[config.model_type][0] or getattr(vision, "vision_use_head", False):
        raise ModelConfigError(
            "only a SigLIP vision tower without pooling head (Gemma 3) or a Pixtral one "
            "(Mistral 3) is described",
            field="model.config.vision_config",
        )
    patch = read_int(vision, "patch_size")
    hidden = read_int(vision, "hidden_size")
    text_hidden = read_int(config.get_text_config(), "hidden_size")
    linears: tuple[tuple[str, int, int], ...] = ()
    if tower == "pixtral":
        projector, linears = _mistral3_projector(config, hidden, text_hidden)
    else:  # the input projection (a bare parameter), the soft-embedding norm
        projector = ((hidden * text_hidden, 0), (hidden, 0))
    return Vision(
        kind="pixtral" if tower == "pixtral" else "siglip",
        hidden=hidden,
        layers=read_int(vision, "num_hidden_layers"),
        intermediate=read_int(vision, "intermediate_size"),
        patches=(read_int(vision, "image_size") // patch) ** 2,
        patch_pixels=read_int(vision, "num_channels", default=3) * patch * patch,
        projector=projector,
        projector_linears=linears,
    )


def _mistral3_projector(
    config: Any, hidden: int, text_hidden: int
) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[str, int, int], ...]]:
    """Mistral3MultiModalProjector's tensors (its norm, the patch merger's linear, two
    linears into the text model, with biases when ``multimodal_projector_bias``) and its
    linears (name, fan in, fan out)."""
    merge = read_int(config, "spatial_merge_size", default=2)
    feature_layers = config.vision_feature_layer
    inputs = hidden * (1 if isinstance(feature_layers, int) else len(feature_layers))
    linears = (
        ("patch_merger.merging_layer", hidden * merge * merge, hidden),
        ("linear_1", inputs, text_hidden),
        ("linear_2", text_hidden, text_hidden),
    )
    bias = ((text_hidden, 0),) if getattr(config, "multimodal_projector_bias", False) else ()
    merger, first, second = ((fan_in * fan_out, fan_out) for _, fan_in, fan_out in linears)
    return ((hidden, 0), merger, first, *bias, second, *bias), linears


def vision_tensors(arch: Arch) -> tuple[tuple[int, int], ...]:
    """The vision tower, then the projector into the text model, per parameter tensor in
    module order: (elements, a linear weight's output rows, else 0: what bitsandbytes
    quantizes, as it does every linear but the output embeddings); none without a tower."""
    vision = arch.vision
    if vision is None:
        return ()
    tower = _pixtral_tensors(vision) if vision.kind == "pixtral" else _siglip_tensors(vision)
    return (*tower, *vision.projector)


def vision_linears(arch: Arch) -> tuple[Linear, ...]:
    """The vision tower's linears, per layer in module order, then the projector's."""
    vision = arch.vision
    if vision is None:
        return ()
    hv, inter, n = vision.hidden, vision.intermediate, vision.layers
    if vision.kind == "siglip":  # Gemma 3's projector is a bare parameter, not a linear
        names = ("k_proj", "v_proj", "q_proj", "out_proj")
        attention = [Linear(f"self_attn.{x}", hv, hv, n, True) for x in names]
        mlp = [Linear("mlp.fc1", hv, inter, n, True), Linear("mlp.fc2", inter, hv, n, True)]
        return (*attention, *mlp)
    mlp = [Linear(f"feed_forward.{x}_proj", hv, inter, n) for x in ("gate", "up")]
    mlp.append(Linear("feed_forward.down_proj", inter, hv, n))
    attention = [Linear(f"attention.{x}_proj", hv, hv, n) for x in ("k", "v", "q", "o")]
    projector = [
        Linear(name, fan_in, fan_out, 1) for name, fan_in, fan_out in vision.projector_linears
    ]
    return (*mlp, *attention, *projector)


def _siglip_tensors(vision: Vision) -> tuple[tuple[int, int], ...]:
    """Gemma 3's SigLIP tower without head: patch conv, positions, layers, final norm."""
    hv, inter = vision.hidden, vision.intermediate
    embeddings = _plain(vision.patch_pixels * hv, hv, vision.patches * hv)  # conv, positions
    attention = ((hv * hv, hv), (hv, 0)) * 4  # k, v, q, out projections with biases
    mlp = ((hv * inter, inter), (inter, 0), (inter * hv, hv), (hv, 0))
    layer = (*_plain(hv, hv), *attention, *_plain(hv, hv), *mlp)
    return (*embeddings, *layer * vision.layers, *_plain(hv, hv))


def _pixtral_tensors(vision: Vision) -> tuple[tuple[int, int], ...]:
    """Mistral 3's Pixtral tower: patch conv and norm (no bias), then each layer's
    attention norm, gated MLP, k / v / q / o projections and MLP norm (its rotary
    tables are buffers)."""
    hv, inter = vision.hidden, vision.intermediate
    mlp = ((hv * inter, inter), (hv * inter, inter), (inter * hv, hv))
    layer = (*_plain(hv), *mlp, *((hv * hv, hv),) * 4, *_plain(hv))
    return (*_plain(vision.patch_pixels * hv, hv), *layer * vision.layers)


def _plain(*elements: int) -> tuple[tuple[int, int], ...]:
    """Tensors that are no linear's weight (norms, biases, embeddings, a conv)."""
    return tuple((n, 0) for n in elements)
