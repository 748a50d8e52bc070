"""pydantic models of the files users and the project write (unknown keys rejected)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class BundledModelFile(BaseModel):
    """configs/models/*.yaml: a cited subset of a model's config.json."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    aliases: list[str] = []
    source: str
    notes: str = ""
    config: dict[str, Any]
