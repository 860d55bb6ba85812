"""Shared output helpers of the CLI: JSON or human text, one place."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd


def add_json_flag(parser: Any) -> None:
    """Add the ``--json`` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def to_jsonable(value: Any) -> Any:
    """Convert numpy, pandas and float specials to plain JSON values (NaN/inf become null)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return to_jsonable(value.to_dict(orient="records"))
    if isinstance(value, pd.Series):
        return to_jsonable(value.to_dict())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_json(payload: Any) -> None:
    print(json.dumps(to_jsonable(payload), indent=2, sort_keys=False))
