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
    ``None`` when not found). ``why`` is the sentence on why pdopt differs. Thresholds quoted by
    the issues (``bound``) are shown as such: the issue says the paper reports this direction,
    but we could not check the number in the paper.
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


def _load(path: Path = CLAIMS_FILE) -> tuple[str, tuple[PaperClaim, ...]]:
    data = tomllib.loads(path.read_text())
    claims = tuple(PaperClaim(**{"low": None, "high": None, **entry}) for entry in data["claim"])
    return data["sources"].rstrip("\n"), claims


SOURCES, CLAIMS = _load()
"""Where the numbers come from (RESULTS.md's last section), and every claim, in file order."""


def claim_for(experiment: str, quantity: str) -> PaperClaim | None:
    """The claim matching a summary row, or None."""
    for claim in CLAIMS:
        if experiment.startswith(claim.experiment) and claim.match in quantity:
            return claim
    return None
