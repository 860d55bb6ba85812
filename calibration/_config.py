"""Model shapes for the harness: a catalogue name, a Hugging Face ``config.json``, or tiny.

A Hugging Face config names the shape with the keys ``num_hidden_layers``, ``hidden_size``,
``num_attention_heads``, ``num_key_value_heads`` (absent = MHA), ``intermediate_size``,
``vocab_size``, ``torch_dtype`` (absent = float16), ``head_dim`` (absent = hidden / heads),
``tie_word_embeddings`` and ``attention_bias`` (Qwen2 configs have no such key but do carry Q, K
and V biases, so ``model_type`` ``qwen2`` implies them). Multimodal configs that nest the language
model under ``text_config`` are read from there.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdopt.errors import InputError
from pdopt.model_spec import DTYPE_BYTES, ModelSpec, get_model

_REQUIRED_KEYS: tuple[str, ...] = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
_QKV_BIAS_MODEL_TYPES = frozenset(("qwen2", "qwen2_moe", "qwen2_vl"))


def load_model_spec(config: str | Path) -> ModelSpec:
    """The shape named by ``config``: a path to a ``config.json`` or a catalogue model name.

    A string ending in ``.json`` or naming an existing file (or a folder holding
    ``config.json``) is read as a Hugging Face config; anything else is looked up with
    :func:`pdopt.model_spec.get_model`.

    Raises
    ------
    InputError
        A config file that cannot be read or breaks a rule (see :func:`parse_hf_config`).
    ParameterError
        A name that is not in the catalogue (the message lists the known names).
    """
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.is_file():
        return parse_hf_config(path)
    return get_model(str(config))


def parse_hf_config(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (keys: see the module docstring).

    The model's name is ``_name_or_path`` when set, else the name of the file's folder.

    Raises
    ------
    InputError
        When the file cannot be read, is not a JSON object, or a shape key is missing, is not an
        integer >= 1, or the head counts do not divide (e.g.
        ``config.json: num_key_value_heads=5 must divide num_attention_heads=28``).
    """
    path = Path(path)
    raw = _read_json(path)
    if isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw:
        raw = {**raw, **raw["text_config"]}
    name = path.name
    ints = {key: _int_field(raw, key, name) for key in _REQUIRED_KEYS}
    heads = ints["num_attention_heads"]
    kv_heads = _int_field(raw, "num_key_value_heads", name, default=heads)
    if heads % kv_heads != 0:
        raise InputError(
            f"{name}: num_key_value_heads={kv_heads} must divide num_attention_heads={heads}"
        )
    head_dim = _int_field(raw, "head_dim", name, default=ints["hidden_size"] // heads)
    return ModelSpec(
        name=str(raw.get("_name_or_path") or path.resolve().parent.name or path.stem),
        num_layers=ints["num_hidden_layers"],
        hidden_size=ints["hidden_size"],
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=ints["intermediate_size"],
        vocab_size=ints["vocab_size"],
        dtype=_dtype_field(raw, name),
        head_dim=head_dim,
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=_qkv_bias(raw),
    )


def tiny_model_spec() -> ModelSpec:
    """The ``--tiny`` shape: 2 layers, hidden 64, 4 heads / 2 KV heads, MLP 128, vocab 256."""
    return ModelSpec("tiny", 2, 64, 4, 2, 128, 256, "float32", qkv_bias=True)


def shard_for_tp(spec: ModelSpec, tp: int) -> ModelSpec:
    """The per-GPU shard of ``spec`` under tensor parallelism of degree ``tp`` (Megatron split).

    Query heads, MLP columns and the vocabulary (LM head) are split ``tp`` ways; KV heads too
    while ``tp <= num_kv_heads`` and replicated beyond (one per GPU, as vLLM does). The hidden
    size is not split. The shard's name gains a ``/tpN`` suffix.

    Raises
    ------
    InputError
        When ``tp`` does not divide the head count or the MLP size.
    """
    if tp == 1:
        return spec
    for field_name in ("num_heads", "intermediate_size"):
        if getattr(spec, field_name) % tp != 0:
            raise InputError(
                f"{spec.name}: {field_name}={getattr(spec, field_name)} is not divisible by tp={tp}"
            )
    return replace(
        spec,
        name=f"{spec.name}/tp{tp}",
        num_heads=spec.num_heads // tp,
        num_kv_heads=max(1, spec.num_kv_heads // tp),
        intermediate_size=spec.intermediate_size // tp,
        vocab_size=-(-spec.vocab_size // tp),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read model config ({exc.strerror})") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path.name} line {exc.lineno}: not valid JSON ({exc.msg}); expected a Hugging "
            "Face config.json"
        ) from None
    if not isinstance(raw, dict):
        raise InputError(f"{path.name}: must hold a JSON object (a Hugging Face config.json)")
    return raw


def _int_field(raw: dict[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = raw.get(key)
    if value is None:
        if default is not None:
            return default
        raise InputError(f"{name}: {key} is missing (a Hugging Face config.json must set it)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name}: {key}={value!r} must be an integer >= 1")
    return value


def _dtype_field(raw: dict[str, Any], name: str) -> str:
    value = raw.get("torch_dtype") or raw.get("dtype") or "float16"
    dtype = str(value).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{name}: torch_dtype={value!r} must be one of {sorted(DTYPE_BYTES)}")
    return dtype


def _qkv_bias(raw: dict[str, Any]) -> bool:
    if "attention_bias" in raw:
        return bool(raw["attention_bias"])
    return str(raw.get("model_type", "")) in _QKV_BIAS_MODEL_TYPES
