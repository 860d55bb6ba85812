"""The GPU profiling harness: measure a model's shape with random weights, write a pdopt profile.

Run ``python -m calibration.profile_gpu --model CONFIG --out profiles/NAME.csv`` (see
``calibration/README.md``). Needs PyTorch (``pip install pdopt[calibrate]``); importing this
package does not import torch, so ``pdopt`` itself never needs it.
"""

from calibration._config import load_model_spec, parse_hf_config, shard_for_tp, tiny_model_spec

__all__ = ["load_model_spec", "parse_hf_config", "shard_for_tp", "tiny_model_spec"]
