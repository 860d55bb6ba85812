"""``python -m pdopt.sim._compiled``: compile the compiled engine into numba's cache
(:func:`pdopt.sim._compiled._warm.main`)."""

from pdopt.sim._compiled._warm import main

if __name__ == "__main__":
    raise SystemExit(main())
