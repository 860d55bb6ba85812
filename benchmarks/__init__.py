"""pdopt benchmarks: ``python -m benchmarks.run --out DIR`` writes one JSON per benchmark."""
