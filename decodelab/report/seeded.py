"""A claim judged on each training seed: ``SeededClaim`` is a ``claims.Claim`` whose quantity is
measured on each seed's rows on its own and whose verdict is theirs together
(``claims.across_seeds``): met only when every seed that measured it meets it. A seed whose rows
hold nothing to measure (it did not train what the claim compares) is left out, not counted
against the claim."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.report.claims import Claim, Judged, Verdict, across_seeds
from decodelab.report.tables import Table, row_value

Rows = Sequence[Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class SeededClaim(Claim):
    """A ``Claim`` judged seed by seed; ``seed_key`` names the seed in a row (``tables.row_value``
    keys: a dotted config key). Its ``Judged.measured`` is the lowest measured seed's (the seed
    whose tables a page shows); ``each_seed`` holds every seed's."""

    seed_key: str = "train.seed"

    def each_seed(self, rows: Rows) -> dict[Any, Judged]:
        """seed -> the claim judged on that seed's rows alone, in seed order, for every seed
        whose rows measure it."""
        by_seed: dict[Any, list] = {}
        for row in rows:
            by_seed.setdefault(row_value(row, self.seed_key), []).append(row)
        judged = {seed: super(SeededClaim, self).judge(seed_rows)
                  for seed, seed_rows in sorted(by_seed.items())}
        return {seed: j for seed, j in judged.items() if j.measured is not None}

    def judge(self, rows: Rows) -> Judged:
        each = self.each_seed(rows)
        if not each:
            return Judged(self, None, Verdict(0, "not measured"))
        first = next(iter(each.values()))
        return Judged(self, first.measured,
                      across_seeds({seed: j.verdict for seed, j in each.items()}))


def seeds_table(claims: Sequence[Claim], rows: Rows) -> Table:
    """One line per claim and seed: what that seed measured and its own verdict (a plain
    ``Claim`` gets one line, seed empty)."""
    body = []
    for claim in claims:
        each = (claim.each_seed(rows) if isinstance(claim, SeededClaim)
                else {None: claim.judge(rows)})
        body += [[claim.text, seed, judged.measured, judged.verdict.text]
                 for seed, judged in each.items()]
    return Table(["claim", "seed", "measured", "verdict"], body)
