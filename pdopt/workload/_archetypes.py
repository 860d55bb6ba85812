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

The Phasor paper's workloads (its Table 1) as length *distributions* around the published means,
each with the paper's SLO budget (its Table 3, TTFT / TPOT seconds), in :attr:`Archetype.slo_s`:

============ ============= ==================== ===============
name         in / out mean Phasor's workload    SLO TTFT / TPOT
============ ============= ==================== ===============
phasor_s_s   128 / 128     Short QA             0.30 / 0.15
phasor_m_m   1024 / 1024   Dialog               0.40 / 0.20
phasor_mix   1024 / 256    BurstGPT (prod. mix) 0.40 / 0.20
phasor_s_l   128 / 2048    Code generation      0.125 / 0.20
phasor_l_s   2048 / 128    Summarization        2.25 / 0.13
phasor_l_l   2048 / 512    Translation          3.00 / 0.18
============ ============= ==================== ===============

The paper samples these from ShareGPT by length band and gives only the means ("~2048"). pdopt
draws lognormal lengths with those means and the spread of a real trace: the standard deviation
of log lengths in the Azure LLM inference 2023 conversation trace (inputs 0.985, outputs 0.859;
measured on ``../shared/data/traces``, the trace BurstGPT derives from), clipped at
``PHASOR_MAX_TOKENS`` = 8192 tokens (the longest prompt the paper profiles, its App. B.2). With
constant lengths, argmax Φ_T routing picks what least-outstanding routing picks; with spread it
does not (issue 15).

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
PHASOR_MAX_TOKENS = 8192
AZURE_CONV_LOG_SIGMA = (0.985, 0.859)
"""Standard deviation of ln(tokens) of the Azure 2023 conversation trace: (inputs, outputs)."""


@dataclass(frozen=True, slots=True)
class Archetype:
    """A named pair of length distributions and where its numbers come from."""

    name: str
    input_lengths: LengthDistribution
    output_lengths: LengthDistribution
    description: str
    slo_s: tuple[float, float] | None = None
    """(TTFT, TPOT) SLO budget in seconds the source paper uses with this workload, if any."""


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


def _phasor(
    name: str, inputs: float, outputs: float, task: str, slo_s: tuple[float, float]
) -> Archetype:
    sigma_in, sigma_out = AZURE_CONV_LOG_SIGMA
    return Archetype(
        name,
        LognormalLengths.from_mean_sigma(inputs, sigma_in, PHASOR_MAX_TOKENS),
        LognormalLengths.from_mean_sigma(outputs, sigma_out, PHASOR_MAX_TOKENS),
        f"Phasor {task}: lognormal, means {inputs:g}/{outputs:g}, Azure-conversation spread, "
        f"SLO {slo_s[0]:g} s / {slo_s[1]:g} s",
        slo_s,
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
            _phasor("phasor_s_s", 128, 128, "Short QA (S-S)", (0.30, 0.15)),
            _phasor("phasor_m_m", 1024, 1024, "Dialog (M-M)", (0.40, 0.20)),
            _phasor("phasor_mix", 1024, 256, "production mix (BurstGPT)", (0.40, 0.20)),
            _phasor("phasor_s_l", 128, 2048, "Code generation (S-L)", (0.125, 0.20)),
            _phasor("phasor_l_s", 2048, 128, "Summarization (L-S)", (2.25, 0.13)),
            _phasor("phasor_l_l", 2048, 512, "Translation (L-L)", (3.00, 0.18)),
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
