"""The decode-form study (issue 18, item 5): which τ(B, C) follows the A100 measurements best?

Run ``python -m calibration.decode_form [--vidur DIR] [--out results/decode_form]``. It reads
the Vidur A100 profiling data (``shared/data/vidur-profiling``, imported with
:func:`pdopt.profile.import_vidur`), fits each candidate decode form to the decode rows and
cross-validates it two ways:

* ``kfold``: 5-fold over rows (folds seeded; the same split as ``FitReport.cv_mape``);
* ``lobo``: leave one batch size out: every row of one profiled B is predicted by the form
  refitted on the other batch sizes. A simulation asks τ at every B from 1 up, most of them never
  profiled, so this is the scheme that decides.

Errors are per batch region (:func:`pdopt.costmodel.error_by_batch_region`). Two data sets:

* ``full``: the decode rows with attention, ``L·(lin(B) + attn_decode(B, c))``, C = B·c. Only
  Llama-2-70B at TP 2 has decode-attention data here (1,501 points, B 1-128), with and without
  the two TP all-reduces per layer.
* ``linear-ops``: the rows of every other model/TP (``L·lin(B)``, no attention, C = B), where
  only the B shape g(B) can be compared (C is collinear with B, so the h(B)·C terms are dropped).

Candidates are ``g(B) + h(B)·C`` (engine-compatible: with B fixed in a segment, τ is affine in C,
as :mod:`pdopt.sim._closed_form` assumes) except the roofline ``d0 + max(a·B, w + k·C)``, fitted
by nonlinear least squares on relative error. Piecewise-linear g uses one non-negative slope per
segment between knots, so τ never decreases with B. The script writes ``decode_form.csv`` (one
row per data set × form × scheme × region) and ``decode_form.md`` (the tables of the README's
"Decode form" section).
"""

from __future__ import annotations

import argparse
import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

# NOTE: the same NNLS as pdopt's own fit (private on purpose: the study must solve exactly as
# fit_decode does, so the "linear" candidate reproduces the shipped fit).
from pdopt.costmodel._fit import _nnls
from pdopt.costmodel._report import (
    BATCH_REGION_EDGES,
    CV_FOLDS,
    CV_SEED,
    error_by_batch_region,
)
from pdopt.profile import import_vidur

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT / ".." / "shared" / "data" / "vidur-profiling"

FloatArray = np.ndarray
Predictor = Callable[[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray], FloatArray]
"""``predict(B_train, C_train, y_train, B_test, C_test)``: fit on the training rows, predict."""


def segments(batch: FloatArray, knots: tuple[float, ...]) -> list[FloatArray]:
    """Piecewise-linear basis in B: the part of B inside each segment between ``knots``.

    With non-negative coefficients ``s_j``, ``Σ_j s_j·segment_j(B)`` is continuous and
    non-decreasing in B, with slope ``s_j`` inside segment ``j``.
    """
    edges = (0.0, *knots, np.inf)
    return [np.clip(batch - lo, 0.0, hi - lo) for lo, hi in itertools.pairwise(edges)]


def indicators(batch: FloatArray, knots: tuple[float, ...]) -> list[FloatArray]:
    """1 where B lies in each region between ``knots`` (regions ``(lo, hi]``), else 0."""
    edges = (0.0, *knots, np.inf)
    return [
        ((batch > lo) & (batch <= hi)).astype(np.float64) for lo, hi in itertools.pairwise(edges)
    ]


Design = Callable[[FloatArray, FloatArray], FloatArray]

DESIGNS: dict[str, Design] = {
    # The shipped form: τ = d0 + d1·B + d2·C.
    "linear": lambda b, c: np.column_stack([np.ones_like(b), b, c]),
    "quadratic-B": lambda b, c: np.column_stack([np.ones_like(b), b, b * b, c]),
    "piecewise-B(16,64)": lambda b, c: np.column_stack(
        [np.ones_like(b), *segments(b, (16, 64)), c]
    ),
    "piecewise-B(8,32,128)": lambda b, c: np.column_stack(
        [np.ones_like(b), *segments(b, (8, 32, 128)), c]
    ),
    # g(B) + h(B)·C: a context slope per region as well.
    "piecewise-B,C(16,64)": lambda b, c: np.column_stack(
        [np.ones_like(b), *segments(b, (16, 64)), *(c * i for i in indicators(b, (16, 64)))]
    ),
}


def nnls_predictor(design: Design) -> Predictor:
    """Fit ``design`` by pdopt's NNLS on the training rows, predict the test rows."""

    def predict(
        bt: FloatArray, ct: FloatArray, yt: FloatArray, bp: FloatArray, cp: FloatArray
    ) -> FloatArray:
        return design(bp, cp) @ _nnls(design(bt, ct), yt)

    return predict


def roofline_predict(
    bt: FloatArray, ct: FloatArray, yt: FloatArray, bp: FloatArray, cp: FloatArray
) -> FloatArray:
    """``d0 + max(a·B, w + k·C)``: fixed cost plus the larger of compute and memory traffic,
    fitted on relative error (all four >= 0)."""

    def model(p: FloatArray, b: FloatArray, c: FloatArray) -> FloatArray:
        return p[0] + np.maximum(p[1] * b, p[2] + p[3] * c)

    start = np.array([0.5 * yt.min(), yt.max() / bt.max(), 0.1 * yt.min(), 1e-7])
    fit = least_squares(
        lambda p: (model(p, bt, ct) - yt) / yt, start, bounds=(0.0, np.inf), x_scale=start
    )
    return np.asarray(model(fit.x, bp, cp), dtype=np.float64)


@dataclass(frozen=True)
class Candidate:
    """One decode form: its name, how it fits and predicts, and whether the engines can run it."""

    name: str
    predict: Predictor
    engine_compatible: bool
    n_params: int


def candidates(*, with_context: bool) -> list[Candidate]:
    """The forms compared. ``with_context=False`` (linear-ops rows, C set to 0): the forms that
    differ only in h(B)·C are left out, as they reduce to their g(B)."""
    probe = np.arange(1.0, 300.0)
    out = [
        Candidate(name, nnls_predictor(design), True, design(probe, probe).shape[1])
        for name, design in DESIGNS.items()
        if with_context or ",C" not in name
    ]
    out.append(Candidate("roofline max", roofline_predict, False, 4))
    return out


@dataclass(frozen=True)
class DataSet:
    """Decode rows of one profile: batch size B, total context C (0 without attention), latency."""

    name: str
    with_context: bool
    batch: FloatArray
    context: FloatArray
    latency_s: FloatArray


def load_data_sets(vidur: Path) -> list[DataSet]:
    """Llama-2-70B TP2 with decode attention (with and without all-reduce), and the linear-ops
    rows of every other model/TP in ``vidur/a100``."""
    all_reduce = vidur / "network" / "a100_dgx" / "all_reduce.csv"
    out: list[DataSet] = []
    for folder, model, tp, with_ar in FULL_CASES + LINEAR_OPS_CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fit-quality warnings of nothing fitted here
            profile = import_vidur(
                vidur / "a100" / folder, model, tp, all_reduce_csv=all_reduce if with_ar else None
            )
        rows = profile.of_kind("decode")
        batch = rows["batch_size"].to_numpy(dtype=np.float64)
        context = rows["total_context_tokens"].to_numpy(dtype=np.float64)
        with_context = bool(np.any(context != batch))
        name = f"{model} TP{tp}" + (" +all-reduce" if with_ar and tp > 1 else "")
        out.append(
            DataSet(
                name,
                with_context,
                batch,
                context if with_context else np.zeros_like(batch),
                rows["latency_s"].to_numpy(dtype=np.float64),
            )
        )
    return out


FULL_CASES: list[tuple[str, str, int, bool]] = [
    ("Llama-2-70b-hf", "Llama-2-70B", 2, True),
    ("Llama-2-70b-hf", "Llama-2-70B", 2, False),
]
"""(folder, model, tp, all-reduce): the profiles with decode attention data."""

LINEAR_OPS_CASES: list[tuple[str, str, int, bool]] = [
    (folder, model, tp, True)
    for folder, model in (
        ("Llama-2-7b-hf", "Llama-2-7B"),
        ("Meta-Llama-3-8B", "Llama-3-8B"),
        ("Llama-2-70b-hf", "Llama-2-70B"),
    )
    for tp in (1, 2, 4, 8)
    if not (model == "Llama-2-70B" and tp == 2)
]
"""The profiles without decode attention (linear ops and all-reduce only, C = B)."""


def cross_validate(data: DataSet, candidate: Candidate, scheme: str) -> FloatArray:
    """Each row's prediction by ``candidate`` refitted without it: ``"insample"`` (no holding
    out), ``"kfold"`` (5 seeded folds) or ``"lobo"`` (leave one batch size out)."""
    b, c, y = data.batch, data.context, data.latency_s
    if scheme == "insample":
        return candidate.predict(b, c, y, b, c)
    if scheme == "kfold":
        groups = np.random.default_rng(CV_SEED).permutation(y.size) % CV_FOLDS
    else:
        groups = b
    predicted = np.empty_like(y)
    for group in np.unique(groups):
        test = groups == group
        predicted[test] = candidate.predict(b[~test], c[~test], y[~test], b[test], c[test])
    return predicted


SCHEMES = ("insample", "kfold", "lobo")


def study(data_sets: list[DataSet]) -> pd.DataFrame:
    """One row per data set × candidate × scheme × region (and region ``"all"``)."""
    frames: list[pd.DataFrame] = []
    for data in data_sets:
        for candidate in candidates(with_context=data.with_context):
            for scheme in SCHEMES:
                predicted = cross_validate(data, candidate, scheme)
                all_rows = error_by_batch_region(
                    data.latency_s, predicted, data.batch, edges=(0.0, float("inf"))
                ).assign(region="all")
                regions = error_by_batch_region(
                    data.latency_s, predicted, data.batch, edges=BATCH_REGION_EDGES
                )
                frame = pd.concat([regions, all_rows], ignore_index=True)
                frame.insert(0, "scheme", scheme)
                frame.insert(0, "n_params", candidate.n_params)
                frame.insert(0, "engine_compatible", candidate.engine_compatible)
                frame.insert(0, "form", candidate.name)
                frame.insert(0, "data_set", data.name)
                frames.append(frame.drop(columns=["cv_mape_pct"]))
    return pd.concat(frames, ignore_index=True)


def markdown(table: pd.DataFrame) -> str:
    """The README tables: MAPE % (mean bias % in brackets) by batch region.

    First the profiles with decode attention, one row per data set × form: in-sample and k-fold
    over all rows, then leave-one-batch-size-out per region. Then the linear-ops profiles: the
    leave-one-batch-size-out MAPE per region averaged over them, and on how many of them each
    form has the lowest overall leave-one-batch-size-out MAPE.
    """
    regions = [r for r in dict.fromkeys(table["region"]) if r != "all"]
    full = table[table["data_set"].isin(_data_sets(table, with_attention=True))]
    lines = [
        "| data set | form | engine | in-sample | 5-fold | "
        + " | ".join(f"LOBO B {r}" for r in regions)
        + " | LOBO all |",
        "|---|---|---|---:|---:|" + "---:|" * (len(regions) + 1),
    ]
    for (data_set, form), rows in full.groupby(["data_set", "form"], sort=False):
        cell = rows.set_index(["scheme", "region"])
        engine = "yes" if bool(rows["engine_compatible"].iloc[0]) else "no"
        values = [_cell(cell, "insample", "all"), _cell(cell, "kfold", "all")]
        values += [_cell(cell, "lobo", r) for r in [*regions, "all"]]
        lines.append(f"| {data_set} | {form} | {engine} | " + " | ".join(values) + " |")
    ops = table[
        table["data_set"].isin(_data_sets(table, with_attention=False))
        & (table["scheme"] == "lobo")
    ]
    if not ops.empty:
        n_sets = ops["data_set"].nunique()
        overall = ops[ops["region"] == "all"]
        best = overall.loc[overall.groupby("data_set")["mape_pct"].idxmin(), "form"].value_counts()
        mean = ops.groupby(["form", "region"], sort=False)["mape_pct"].mean()
        lines += [
            "",
            f"Linear ops only ({n_sets} model/TP profiles without decode attention, C = B): "
            "leave-one-batch-size-out MAPE %, mean over the profiles",
            "",
            "| form | " + " | ".join(f"B {r}" for r in regions) + " | all | best on |",
            "|---|" + "---:|" * (len(regions) + 2),
        ]
        for form in dict.fromkeys(ops["form"]):
            values = [f"{mean.get((form, r), float('nan')):.2f}" for r in [*regions, "all"]]
            won = f"{int(best.get(form, 0))}/{n_sets}"
            lines.append(f"| {form} | " + " | ".join(values) + f" | {won} |")
    return "\n".join(lines) + "\n"


def _data_sets(table: pd.DataFrame, *, with_attention: bool) -> list[str]:
    """Data sets whose rows hold decode attention (their forms include the h(B)·C ones)."""
    has_context = table.groupby("data_set")["form"].agg(lambda f: any(",C" in x for x in f))
    return [str(name) for name, flag in has_context.items() if bool(flag) == with_attention]


def _cell(cell: pd.DataFrame, scheme: str, region: str) -> str:
    if (scheme, region) not in cell.index:
        return "-"
    row = cell.loc[(scheme, region)]
    return f"{row['mape_pct']:.2f} ({row['bias_pct']:+.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, default=VIDUR, help="vidur-profiling folder")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "decode_form")
    parser.add_argument(
        "--full-only", action="store_true", help="only the profiles with decode attention"
    )
    args = parser.parse_args(argv)
    data_sets = load_data_sets(args.vidur)
    if args.full_only:
        data_sets = [d for d in data_sets if d.with_context]
    table = study(data_sets)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "decode_form.csv", index=False)
    (args.out / "decode_form.md").write_text(markdown(table), encoding="utf-8")
    print(f"wrote {args.out / 'decode_form.csv'} and {args.out / 'decode_form.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
