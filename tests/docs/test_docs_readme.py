"""The README's Python examples run as written (so the documentation stays true).

Blocks run in order in one namespace, from the repository root; a block that reads
``../shared/data`` skips the whole chain when that folder is absent (a user's fresh clone).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_python_examples() -> None:
    assert len(python_blocks()) >= 2


def test_readme_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks()
    if any("../shared" in b for b in blocks) and not SHARED.is_dir():
        pytest.skip("README examples read ../shared/data, which is absent here")
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.metrics()["finished"] == 1000  # type: ignore[attr-defined]
    plan = namespace["plan"]
    assert plan.status == "optimal"  # type: ignore[attr-defined]
    assert plan.describe().startswith("1 × A100-80GB/tp1 prefill")  # type: ignore[attr-defined]
