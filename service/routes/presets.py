"""``GET /presets``: the bundled model configs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ckpt_core import list_presets
from service.responses import PresetsResponse

router = APIRouter(tags=["presets"])


@router.get("/presets", response_model=PresetsResponse, summary="List the bundled model configs")
async def presets() -> Any:
    return {"presets": [preset.to_dict() for preset in list_presets()]}
