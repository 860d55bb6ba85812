"""Named workload archetypes with the request lengths used by the seed papers.

Fixed-length archetypes (input / output tokens, every request alike):

=============== ============ ==========================================
name            in / out     use case in the papers
=============== ============ ==========================================
short_short     128 / 128    short prompts, short answers
long_short      2048 / 128   summarization
short_long      128 / 2048   code generation
medium_medium   1024 / 1024  dialog
long_long       2048 / 512   translation
production_mix  1024 / 256   production mix (only its means are given;
                             it is modelled as fixed lengths)
=============== ============ ==========================================

Data-set-like archetypes, lognormal lengths fitted to the published mean and median
(:meth:`LognormalLengths.from_mean_median`):

========= ========================== ==========================
name      input mean / median        output mean / median
========= ========================== ==========================
alpaca    20.6 / 17                  163.8 / 119
sharegpt  343.8 / 148                237.2 / 152
longbench 2686.9 / 2736.5            101.8 / 19
========= ========================== ==========================

LongBench inputs have a mean *below* their median, which no lognormal has: the inputs pile up
against the context window. They are modelled as a lognormal clipped at
``LONGBENCH_MAX_INPUT_TOKENS`` = 4096 (a 4K window; our choice, the papers give no cap) whose
clipped mean is 2686.9 and median 2736.5 (sigma ≈ 0.86, about a third of prompts at the cap).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pdopt._validation import check_one_of
from pdopt.workload._generators import (
    ConstantLengths,
    LengthDistribution,
    LognormalLengths,
    gamma_arrivals,
    generate_workload,
    poisson_arrivals,
)
from pdopt.workload._workload import Workload

LONGBENCH_MAX_INPUT_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class Archetype:
    """A named pair of length distributions and where its numbers come from."""

    name: str
    input_lengths: LengthDistribution
    output_lengths: LengthDistribution
    description: str


def _fixed(name: str, input_tokens: int, output_tokens: int, description: str) -> Archetype:
    return Archetype(
        name, ConstantLengths(input_tokens), ConstantLengths(output_tokens), description
    )


def _lognormal(
    name: str,
    inputs: tuple[float, float],
    outputs: tuple[float, float],
    description: str,
    max_input_tokens: int | None = None,
) -> Archetype:
    return Archetype(
        name,
        LognormalLengths.from_mean_median(*inputs, max_tokens=max_input_tokens),
        LognormalLengths.from_mean_median(*outputs),
        description,
    )


ARCHETYPES: Mapping[str, Archetype] = MappingProxyType(
    {
        a.name: a
        for a in (
            _fixed("short_short", 128, 128, "short prompts, short answers (128/128)"),
            _fixed("long_short", 2048, 128, "summarization (2048/128)"),
            _fixed("short_long", 128, 2048, "code generation (128/2048)"),
            _fixed("medium_medium", 1024, 1024, "dialog (1024/1024)"),
            _fixed("long_long", 2048, 512, "translation (2048/512)"),
            _fixed("production_mix", 1024, 256, "production mix (1024/256, fixed lengths)"),
            _lognormal(
                "alpaca",
                (20.6, 17),
                (163.8, 119),
                "Alpaca-like: lognormal, mean/median in 20.6/17, out 163.8/119",
            ),
            _lognormal(
                "sharegpt",
                (343.8, 148),
                (237.2, 152),
                "ShareGPT-like: lognormal, mean/median in 343.8/148, out 237.2/152",
            ),
            _lognormal(
                "longbench",
                (2686.9, 2736.5),
                (101.8, 19),
                "LongBench-like: mean/median in 2686.9/2736.5 (lognormal clipped at "
                f"{LONGBENCH_MAX_INPUT_TOKENS}), out 101.8/19 (lognormal)",
                max_input_tokens=LONGBENCH_MAX_INPUT_TOKENS,
            ),
        )
    }
)
"""Every archetype by name (read-only)."""


def get_archetype(name: str) -> Archetype:
    """The archetype called ``name``; a :class:`ParameterError` lists the names allowed."""
    return ARCHETYPES[check_one_of(name, ARCHETYPES, "name", "get_archetype")]


def archetype_workload(
    name: str,
    rate_per_s: float,
    *,
    n_requests: int | None = None,
    duration_s: float | None = None,
    cv: float = 1.0,
    seed: int | None = None,
) -> Workload:
    """A workload with an archetype's lengths and renewal arrivals at ``rate_per_s``.

    Parameters
    ----------
    name : str
        One of ``ARCHETYPES``.
    rate_per_s : float
        Mean arrival rate (requests per second).
    n_requests, duration_s : int or float
        Exactly one: how many requests, or the window ``[0, duration_s)`` to fill.
    cv : float
        Inter-arrival coefficient of variation: 1 is Poisson (:func:`poisson_arrivals`), other
        values use gamma gaps (:func:`gamma_arrivals`; 3 gives micro-clustered bursts).
    seed : int or None
        Seed of every random draw (arrivals and both length columns).

    Examples
    --------
    >>> w = archetype_workload("long_short", 4.0, n_requests=100, seed=7)
    >>> (len(w), int(w.input_tokens[0]), int(w.output_tokens[0]))
    (100, 2048, 128)
    """
    archetype = ARCHETYPES[check_one_of(name, ARCHETYPES, "name", "archetype_workload")]
    if cv == 1.0:
        arrival_s = poisson_arrivals(
            rate_per_s, n_requests=n_requests, duration_s=duration_s, seed=seed
        )
    else:
        arrival_s = gamma_arrivals(
            rate_per_s, cv, n_requests=n_requests, duration_s=duration_s, seed=seed
        )
    return generate_workload(
        arrival_s, archetype.input_lengths, archetype.output_lengths, seed=seed, name=name
    )
