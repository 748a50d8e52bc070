"""The event engine's books, checked at every event (tests only: ``simulate(..., check_invariants=True)``):
every request accounted for, memory adding up, nothing held twice."""

from __future__ import annotations

from itertools import accumulate, pairwise

# a running group's record in kvplan.core.sim.engine (a list, indexed by these positions)
_I, _TB, _N, _WFROM, _WASTE, _GSH, _OFFS, _REGION, _ADMIT, _TTFT = range(10)


def packed_row(q: int, B: int, w: int) -> int:
    """One sequence's fields when its tokens are ``t(s) = tb + s`` with ``tb = q (mod B)``: field r (r < B)
    is its last block's slack at a step r (mod B), field B + r the sum of fields 0 .. r - 1."""
    slack = [(-q - r) % B for r in range(B)]
    fields = slack + [0, *accumulate(slack[:-1])]
    return sum(v << (w * k) for k, v in enumerate(fields))


def check_invariants(v: dict) -> None:
    """Every request accounted for; memory adds up; nothing held twice (placement regions disjoint).
    ``v`` is the loop's local variables at the end of a step's admission."""
    running, s, B, paged = v["running"], v["s"], v["B"], v["paged"]
    accounted = (v["completed"] + sum(v["reasons"].values()) + len(running) + len(v["front"])
                 + (v["nxt"] - v["lo"]) + (v["total"] - v["nxt"]))
    assert accounted == v["n_total"], "a request was lost"
    assert set(v["front"]) == set(v["held"]) and len(v["front"]) == len(v["held"]) == v["nfront"]
    used, allocated = v["used"], v["allocated"]
    assert 0 <= used <= allocated <= v["pool"], (used, allocated)
    internal = sum(r[_WASTE] for r in running.values() if s >= r[_WFROM])
    assert 0 <= internal <= allocated - used
    assert v["N"] == sum(r[_N] for r in running.values())
    Pb = v["Pb"]
    truth = sum(B * ((r[_GSH] - Pb) - r[_N] * r[_GSH]) + r[_N] * (r[_TB] + s) for r in running.values())
    assert truth + B * Pb == v["U"] + v["N"] * s
    if paged:
        assert allocated % B == 0 and allocated // B <= v["P"]
        blocks = sum((r[_GSH] - Pb) + r[_N] * (-(-(r[_TB] + s) // B) - r[_GSH]) for r in running.values())
        assert allocated == (B * (blocks + Pb) if running else 0)
        w = v["w"]  # every packed field (slack and running sums), not only the one read at step s
        assert v["slack"] == sum(r[_N] * packed_row(r[_TB] % B, B, w) for r in running.values())
        assert all((v["slack"] >> w * k & v["m"]) < 1 << (w - 1) for k in range(2 * B)), "a field overflowed"
    else:
        regions = sorted((off, r[_REGION]) for r in running.values() for off in r[_OFFS])
        for (a, size), (b, _) in pairwise(regions):
            assert a + size <= b, "two reservations overlap"
        assert sum(size for _, size in regions) == v["alloc_contig"]
        assert v["place"].free_slots() == v["pool"] - v["alloc_contig"]
