"""GPU prices an hour, as a user gives them (``--price H100-80GB=2.49,H200=3.10``, or a prices file): plain data,
keyed by the catalog's GPU names."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kvplan.errors import InputError
from kvplan.io.filekinds import expect_kind
from kvplan.io.gpus import get_gpu
from kvplan.io.yamlio import load_yaml, parse_model


class PricesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prices: dict[str, float] = Field(min_length=1, description="GPU name (`kvplan gpus`) to a price per GPU-hour.")
    as_of: str | None = Field(None, description="When the prices were read, e.g. 2026-05.")
    currency: str | None = Field(None, description="e.g. USD; shown beside the costs.")


def _canonical(name: str, price: float, what: str) -> tuple[str, float]:
    if not price > 0 or price != price:
        raise InputError(f"{what}: the price of {name} must be a positive number (got {price})")
    return get_gpu(name).name, float(price)


def canonical_prices(prices: dict[str, float], what: str) -> dict[str, float]:
    """A mapping of GPU names (aliases allowed) to prices, keyed by the catalog's names."""
    return dict(_canonical(k, v, what) for k, v in prices.items())


def parse_prices(flag: str | None, path: Path | None = None) -> tuple[dict[str, float], str | None]:
    """Prices by catalog GPU name (the flag's over the file's), and the file's currency."""
    prices: dict[str, float] = {}
    currency = None
    if path is not None:
        data = load_yaml(path)
        expect_kind(path, data, "prices")
        parsed = parse_model(path, PricesFile, data)
        assert isinstance(parsed, PricesFile)
        prices.update(_canonical(k, v, str(path)) for k, v in parsed.prices.items())
        currency = parsed.currency
    for part in (p.strip() for p in (flag or "").split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            price = float(value) if sep else float("nan")
        except ValueError:
            price = float("nan")
        if price != price:
            raise InputError(f"--price takes GPU=PRICE pairs, e.g. H100-80GB=2.49,H200=3.10 (got {part!r})")
        prices.update([_canonical(name.strip(), price, "--price")])
    return prices, currency
