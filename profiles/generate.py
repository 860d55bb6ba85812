"""Regenerate the shipped roofline profiles and the Phasor parameter file.

Run from the repository root: ``python profiles/generate.py`` (``--check`` only compares).
Every file here is a pure function of pdopt's catalogues and roofline defaults, so a test
(``tests/profile/test_profile_roofline.py``) checks that the shipped files equal what this
script produces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from pdopt.costmodel import PrefillModel, PublishedParameters
from pdopt.profile import format_profile, roofline_profile

HERE = Path(__file__).resolve().parent

# (GPU, model as the papers name it, TP): the seed papers' pairs. TP is the smallest degree at
# which the weights fit with room for KV at memory_utilization 0.9.
ROOFLINE_PAIRS: tuple[tuple[str, str, int], ...] = (
    ("V100-32GB", "Qwen2.5-7B", 1),  # Phasor
    ("H800", "Llama-3.1-8B", 1),  # EcoServe / Arrow
    ("L20", "CodeLlama-34B", 2),  # 67.5 GB of weights: 2 × 48 GB
    ("A800-80GB", "Qwen2-72B", 4),  # 145 GB of weights: 4 × 80 GB
    ("A100-80GB", "Llama-2-7B", 1),  # DistServe / Splitwise / Vidur
    ("H100-SXM", "Llama-3-8B", 1),
)

PHASOR_FILE = "phasor_v100_qwen2.5-7b.json"


def roofline_file_name(gpu: str, model: str, tp: int) -> str:
    """``<gpu>_<model>[_tp<N>]_roofline.csv``, lower case."""
    tp_part = f"_tp{tp}" if tp > 1 else ""
    return f"{gpu.lower()}_{model.lower()}{tp_part}_roofline.csv"


def roofline_texts() -> dict[str, str]:
    """File name → text of every shipped roofline profile."""
    texts: dict[str, str] = {}
    for gpu, model, tp in ROOFLINE_PAIRS:
        profile = roofline_profile(gpu, model, tp)
        # Keep the papers' model name (an alias of a catalogued shape) in the metadata.
        profile = dataclasses.replace(profile, meta=dataclasses.replace(profile.meta, model=model))
        texts[roofline_file_name(gpu, model, tp)] = format_profile(profile)
    return texts


def phasor_parameters() -> PublishedParameters:
    """The constants the Phasor paper publishes for V100 + Qwen2.5-7B, converted to SI units."""
    published = {
        "P_peak": "121 TFLOP/s",
        "alpha": 4.25e-5,
        "beta": 6.8e-3,
        "M_total": "32 GB",
        "delta_t": "50 ms",
        "theta_frag": 0.168,
        "theta_flow": 0.62,
    }
    return PublishedParameters(
        gpu="V100-32GB",
        model="Qwen2.5-7B",
        source="published constants: Phasor paper (V100 + Qwen2.5-7B); not measured by pdopt",
        units=(
            "SI (s, FLOP, FLOP/s, bytes). Phasor's alpha and beta are in units where P_peak is in "
            "TFLOP/s and T in seconds, so alpha_flop_per_token2 = 4.25e-5 * 1e12 and "
            "beta_flop_per_token = 6.8e-3 * 1e12; M_total 32 GB read as 32 GiB (the V100's HBM)"
        ),
        prefill=PrefillModel(
            alpha_flop_per_token2=4.25e-5 * 1e12,
            beta_flop_per_token=6.8e-3 * 1e12,
            p_peak_flops=121e12,
        ),
        m_total_bytes=float(32 * 2**30),
        delta_t_s=0.05,
        theta_frag=0.168,
        theta_flow=0.62,
        published=published,
    )


def all_texts() -> dict[str, str]:
    """File name → text of every generated file."""
    texts = roofline_texts()
    texts[PHASOR_FILE] = json.dumps(phasor_parameters().to_dict(), indent=2) + "\n"
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a change")
    args = parser.parse_args(argv)
    stale = []
    for name, text in all_texts().items():
        path = HERE / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    verb = "differ" if args.check else "written"
    print(f"{len(stale)} file(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
