"""The seed papers' claims that RESULTS.md sets beside pdopt's numbers, read from the data file
``paper_claims.toml`` (each claim with its value, where it came from and why pdopt differs; the
file's ``sources`` text says where we searched)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

CLAIMS_FILE = Path(__file__).resolve().parent / "paper_claims.toml"


@dataclass(frozen=True, slots=True)
class PaperClaim:
    """What a paper reports for one of our summary quantities.

    ``match`` selects summary rows: the row's ``experiment`` starts with ``experiment`` and its
    ``quantity`` contains ``match``. ``low``/``high`` bound the paper's value (equal for a point;
    ``None`` when not found). ``why`` is the sentence on why pdopt differs. A ``[[points]]``
    table of the claims file gives many exact-match claims sharing source and explanation.
    Thresholds quoted by the issues (``bound``) are shown as such: the issue says the paper
    reports this direction, but we could not check the number in the paper.
    """

    experiment: str
    match: str
    low: float | None
    high: float | None
    paper_text: str
    source: str
    why: str
    bound: str = ""
    """``"ge"`` / ``"le"``: the paper value is a threshold (at least / at most), not a point."""
    exact: bool = False
    """Match only a row whose quantity equals ``match`` (the ``[[points]]`` tables)."""

    def matches(self, experiment: str, quantity: str) -> bool:
        """Whether this claim is the paper's number for a summary row."""
        if not experiment.startswith(self.experiment):
            return False
        return quantity == self.match if self.exact else self.match in quantity


def _points(entry: dict[str, object]) -> list[PaperClaim]:
    """One exact-match claim per ``quantity = value`` of a ``[[points]]`` table (a table of
    paper numbers sharing their source and explanation)."""
    values = entry["values"]
    assert isinstance(values, dict)
    common = {k: v for k, v in entry.items() if k != "values"}
    return [
        PaperClaim(
            **{**common, "match": quantity, "low": float(v), "high": float(v), "exact": True}
        )  # type: ignore[arg-type]
        for quantity, v in values.items()
    ]


def _load(path: Path = CLAIMS_FILE) -> tuple[str, tuple[PaperClaim, ...]]:
    data = tomllib.loads(path.read_text())
    points = [claim for entry in data.get("points", []) for claim in _points(entry)]
    claims = tuple(PaperClaim(**{"low": None, "high": None, **entry}) for entry in data["claim"])
    # exact points first, so a broad ``match`` never takes a row a point names
    return data["sources"].rstrip("\n"), (*points, *claims)


SOURCES, CLAIMS = _load()
"""Where the numbers come from (RESULTS.md's last section), and every claim, in file order."""


def claim_for(experiment: str, quantity: str) -> PaperClaim | None:
    """The claim matching a summary row, or None."""
    for claim in CLAIMS:
        if claim.matches(experiment, quantity):
            return claim
    return None
