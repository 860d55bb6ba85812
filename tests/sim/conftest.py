"""Fixtures shared by the simulator's tests."""

from __future__ import annotations

import pytest

from pdopt.sim import _simulate as simulate_module


@pytest.fixture
def no_fallback(monkeypatch):
    """Fails a compiled run that hands itself back to the Python engine (ERR_UNSUPPORTED) while
    armed (``no_fallback["compiled"] = True``; tests/sim/test_sim_compiled_colocated.py's
    ``both`` arms it around the compiled run)."""
    real = simulate_module._simulate_python
    armed = {"compiled": False}

    def guarded(*args, **kwargs):
        assert not armed["compiled"], "the compiled run fell back to the Python engine"
        return real(*args, **kwargs)

    monkeypatch.setattr(simulate_module, "_simulate_python", guarded)
    return armed
