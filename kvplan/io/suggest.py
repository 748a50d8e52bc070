"""Names to offer for an unknown one (``--gpu A100``, ``kvplan size llama3.1``).

difflib alone ranks by edit similarity, so ``A100`` gets ``A10`` first and misses ``A100-40GB`` (a
suffix of six characters costs more than one deleted zero). What a user types is usually the start
of the name they mean: names that start with it come first, then names that contain it, then
difflib's close matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def suggestions(typed: str, names: Iterable[tuple[str, str]], *, cutoff: float, limit: int = 5,
                norm: Callable[[str], str] = str.lower) -> list[str]:
    """Up to ``limit`` names for ``typed`` from ``names``, pairs of (a name or alias to match, the name to
    offer), compared through ``norm``: starting with it, containing it (the shortest match first: the
    least that was not typed), then close."""
    key = norm(typed.strip())
    pairs = [(norm(match), offer) for match, offer in names]
    out: list[str] = []

    def add(offers: Iterable[str]) -> None:
        for offer in offers:
            if offer not in out:
                out.append(offer)

    if key:
        add(offer for _, offer in sorted((p for p in pairs if p[0].startswith(key)), key=_shortest))
        add(offer for _, offer in sorted((p for p in pairs if key in p[0]), key=_shortest))
    by_match = {}
    for match, offer in pairs:
        by_match.setdefault(match, offer)
    add(by_match[m] for m in difflib.get_close_matches(key, list(by_match), n=limit, cutoff=cutoff))
    return out[:limit]


def _shortest(pair: tuple[str, str]) -> tuple[int, str]:
    return len(pair[0]), pair[0]
