"""The GPU catalogue: dense FP16/BF16 peaks, memory, bandwidths and power from public data sheets.

Conventions (so every row reads alike):

* ``peak_flops``: dense FP16/BF16 tensor-core peak, no structured sparsity (data sheets print the
  sparse figure, twice the dense one, for Ampere and later; we halve it). ``fp8_peak_flops``:
  the dense FP8 peak the same way (0: no FP8 tensor cores).
* ``memory_bytes``: the memory a serving engine can see, with the board's default ECC setting.
  HBM boards: the marketed capacity read as GiB (2**30 bytes); HBM stacks come in power-of-two
  sizes, their ECC is side-band, and ``nvidia-smi`` totals agree within 2% (V100 32510 MiB,
  A100 81920 MiB, H100 81559 MiB, H200 143771 MiB). GDDR6 data-center boards (L20, L40S, L4,
  A10G) ship with ECC on, which is inline and holds back 1/16 of the memory: ``nvidia-smi``
  totals (:data:`_GDDR6_ECC_MIB`) of 46068 MiB for the 48 GB boards (49140 MiB with ECC off),
  23034 MiB (L4) and 23028 MiB (A10G); the marketed 48 or 24 GiB would overstate them by 6.7%
  and the KV room left after the weights by much more.
* ``hbm_bw_bytes_per_s``: data-sheet memory bandwidth, decimal (1 GB/s = 1e9 B/s).
* ``link_bw_bytes_per_s``: intra-node GPU-to-GPU bandwidth in ONE direction: half the
  bidirectional NVLink total the data sheets print; PCIe Gen4 x16 is 32 GB/s per direction.
* ``idle_power_w``: an estimate (no data sheet gives it): roughly what ``nvidia-smi`` reports
  for an idle, clocked-down board of that class.
* ``cost_per_hour``: a rough relative on-demand price in USD/h per GPU (public cloud list prices
  in 2024, rounded; the 2025 additions from the cloud offer named on their row); use it to rank
  options, not to budget, and pass your own prices to the planner.
* ``generation``: the architecture (Volta, Ampere, Ada, Hopper, Blackwell, CDNA3) from the same
  data sheet; it selects the roofline prior's efficiency preset (:mod:`pdopt.profile._knobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pdopt.hardware._gpu import GpuSpec

_GIB = float(2**30)
_MIB = float(2**20)

_GDDR6_ECC_MIB = {"L20": 46068, "L40S": 46068, "L4": 23034, "A10G": 23028}
"""``nvidia-smi`` ``memory.total`` (MiB) of the GDDR6 boards with their default ECC on, as
public ``nvidia-smi`` outputs of each board show it (drivers 535-595)."""


def _gddr6(name: str) -> float:
    """Bytes an engine sees on the GDDR6 board ``name`` (:data:`_GDDR6_ECC_MIB`)."""
    return _GDDR6_ECC_MIB[name] * _MIB


_GB = 1e9
_TFLOPS = 1e12

_GPU_LIST: tuple[GpuSpec, ...] = (
    # Tesla V100 SXM2 32GB data sheet: 125 TFLOPS tensor (FP16), 32 GB HBM2 at 900 GB/s,
    # NVLink 2.0 300 GB/s bidirectional, 300 W, no FP8. Idle ~40 W estimated. Phasor measures
    # 121 TFLOP/s.
    GpuSpec(
        "V100-32GB", 125 * _TFLOPS, 32 * _GIB, 900 * _GB, 150 * _GB, 40.0, 300.0, 2.5,
        generation="volta",
    ),
    # A100 SXM4 80GB data sheet: 312 TFLOPS BF16/FP16 dense (624 sparse), 80 GB HBM2e at
    # 2,039 GB/s, NVLink 3.0 600 GB/s bidirectional, 400 W, no FP8. Idle ~60 W estimated.
    GpuSpec(
        "A100-80GB", 312 * _TFLOPS, 80 * _GIB, 2039 * _GB, 300 * _GB, 60.0, 400.0, 4.0,
        generation="ampere",
    ),
    # A800 SXM4 80GB data sheet: as the A100 80GB but NVLink capped at 400 GB/s bidirectional.
    # Idle ~60 W estimated.
    GpuSpec(
        "A800-80GB", 312 * _TFLOPS, 80 * _GIB, 2039 * _GB, 200 * _GB, 60.0, 400.0, 3.5,
        generation="ampere",
    ),
    # H100 SXM5 80GB data sheet: 1,979 TFLOPS BF16/FP16 with sparsity -> 989.5 dense, FP8 3,958
    # sparse -> 1,979 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 4.0 900 GB/s bidirectional, up to
    # 700 W. Idle ~70 W estimated.
    GpuSpec(
        "H100-SXM", 989.5 * _TFLOPS, 80 * _GIB, 3350 * _GB, 450 * _GB, 70.0, 700.0, 7.0,
        fp8_peak_flops=1979 * _TFLOPS,
        generation="hopper",
    ),
    # H800 SXM5 80GB data sheet: compute and memory as the H100 SXM (989.5 dense, FP8 1,979
    # dense, 3.35 TB/s), NVLink capped at 400 GB/s bidirectional, up to 700 W. Idle ~70 W est.
    GpuSpec(
        "H800", 989.5 * _TFLOPS, 80 * _GIB, 3350 * _GB, 200 * _GB, 70.0, 700.0, 6.0,
        fp8_peak_flops=1979 * _TFLOPS,
        generation="hopper",
    ),
    # H200 SXM 141GB data sheet: 1,979 TFLOPS BF16/FP16 sparse -> 989.5 dense, FP8 3,958 sparse
    # -> 1,979 dense, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s bidirectional, up to 700 W.
    # Idle ~75 W estimated.
    GpuSpec(
        "H200", 989.5 * _TFLOPS, 141 * _GIB, 4800 * _GB, 450 * _GB, 75.0, 700.0, 8.0,
        fp8_peak_flops=1979 * _TFLOPS,
        generation="hopper",
    ),
    # L20 48GB data sheet: 119.5 TFLOPS FP16/BF16 tensor dense (239 sparse), FP8 239 dense (478
    # sparse), 48 GB GDDR6 at 864 GB/s, no NVLink: PCIe Gen4 x16 (64 GB/s bidirectional), 275 W.
    # Idle ~30 W estimated.
    GpuSpec(
        "L20", 119.5 * _TFLOPS, _gddr6("L20"), 864 * _GB, 32 * _GB, 30.0, 275.0, 1.5,
        fp8_peak_flops=239 * _TFLOPS,
        generation="ada",
    ),
    # NVIDIA HGX B200 data sheet, per GPU: 4.5 PFLOPS FP16/BF16 sparse -> 2.25 dense, FP8 9
    # sparse -> 4.5 dense, 180 GB HBM3e (1.44 TB per 8 GPUs) at 7.7 TB/s (62 TB/s per 8 GPUs),
    # NVLink 5 1.8 TB/s bidirectional, up to 1,000 W. Idle ~100 W estimated. Price: rough 2025
    # neocloud on-demand order (about 1.5x an H200).
    GpuSpec(
        "B200", 2250 * _TFLOPS, 180 * _GIB, 7700 * _GB, 900 * _GB, 100.0, 1000.0, 12.0,
        fp8_peak_flops=4500 * _TFLOPS,
        generation="blackwell",
    ),
    # NVIDIA H20 (China export Hopper) product brief: 148 TFLOPS FP16/BF16 dense, FP8 296 dense,
    # 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s bidirectional, 400 W. Idle ~60 W estimated.
    # Price: rough rental order (between an A800 and an H800).
    GpuSpec(
        "H20", 148 * _TFLOPS, 96 * _GIB, 4000 * _GB, 450 * _GB, 60.0, 400.0, 3.0,
        fp8_peak_flops=296 * _TFLOPS,
        generation="hopper",
    ),
    # NVIDIA L40S data sheet: 362.05 TFLOPS BF16 dense (733 sparse), FP8 1,466 sparse -> 733 dense,
    # 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 (no NVLink), 350 W. Idle ~35 W estimated. Price:
    # AWS g6e.xlarge on-demand, us-east-1, 2025: $1.86/h.
    GpuSpec(
        "L40S", 362.05 * _TFLOPS, _gddr6("L40S"), 864 * _GB, 32 * _GB, 35.0, 350.0, 1.86,
        fp8_peak_flops=733 * _TFLOPS,
        generation="ada",
    ),
    # NVIDIA L4 data sheet: 242 TFLOPS BF16 sparse -> 121 dense, FP8 485 sparse -> 242.5 dense,
    # 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16, 72 W. Idle ~16 W estimated. Price: AWS g6.xlarge
    # on-demand, us-east-1, 2025: $0.805/h.
    GpuSpec(
        "L4", 121 * _TFLOPS, _gddr6("L4"), 300 * _GB, 32 * _GB, 16.0, 72.0, 0.805,
        fp8_peak_flops=242.5 * _TFLOPS,
        generation="ada",
    ),
    # A10G (AWS G5): NVIDIA publishes no A10G data sheet; these are the NVIDIA A10 data sheet's
    # 125 TFLOPS BF16 dense (250 sparse), 24 GB GDDR6 at 600 GB/s, PCIe Gen4 x16, 150 W, no FP8.
    # The A10G runs at lower tensor clocks, so its peak is at most this. Idle ~15 W estimated.
    # Price: AWS g5.xlarge on-demand, us-east-1: $1.006/h.
    GpuSpec(
        "A10G", 125 * _TFLOPS, _gddr6("A10G"), 600 * _GB, 32 * _GB, 15.0, 150.0, 1.006,
        generation="ampere",
    ),
    # AMD Instinct MI300X data sheet: 1,307.4 TFLOPS BF16/FP16 dense, FP8 2,614.9 dense, 192 GB
    # HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s bidirectional (896 GB/s) -> 448 GB/s
    # one direction, 750 W. Idle ~100 W estimated. Price: rough 2025 on-demand order (below an
    # H200).
    GpuSpec(
        "MI300X", 1307.4 * _TFLOPS, 192 * _GIB, 5300 * _GB, 448 * _GB, 100.0, 750.0, 6.0,
        fp8_peak_flops=2614.9 * _TFLOPS,
        generation="cdna3",
    ),
)  # fmt: skip

GPUS: Mapping[str, GpuSpec] = MappingProxyType({gpu.name: gpu for gpu in _GPU_LIST})
"""Every catalogued GPU by its name (read-only)."""

# Names people also write for the same boards; looked up case-insensitively.
_ALIASES: dict[str, str] = {
    "v100": "V100-32GB",
    "v100-sxm2-32gb": "V100-32GB",
    "a100": "A100-80GB",
    "a100-sxm-80gb": "A100-80GB",
    "a800": "A800-80GB",
    "h100": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h800-sxm": "H800",
    "h200-141gb": "H200",
    "l20-48gb": "L20",
    "b200-180gb": "B200",
    "hgx-b200": "B200",
    "h20-96gb": "H20",
    "l40s-48gb": "L40S",
    "l4-24gb": "L4",
    "a10g-24gb": "A10G",
    "mi300x-192gb": "MI300X",
    # the names torch.cuda.get_device_name and nvidia-smi report (a measured profile's
    # `# gpu:` line), after the vendor prefix is dropped (_DEVICE_PREFIXES)
    "h100 80gb hbm3": "H100-SXM",
    "a100-sxm4-80gb": "A100-80GB",
    "a800-sxm4-80gb": "A800-80GB",
}

# Vendor prefixes of device names ("NVIDIA H200", "Tesla V100-SXM2-32GB", "AMD Instinct MI300X").
_DEVICE_PREFIXES = ("nvidia ", "tesla ", "amd instinct ", "amd ")


def get_gpu(name: str) -> GpuSpec:
    """The catalogued :class:`GpuSpec` called ``name`` (case-insensitive; a few aliases, and the
    device names that PyTorch and nvidia-smi report, such as ``"NVIDIA H100 80GB HBM3"``), or
    the spec a ``$PDOPT_SPECS`` file gives that name, which replaces the catalogue's row
    (:func:`pdopt._specs_file.env_spec`).

    Raises
    ------
    ParameterError
        When ``name`` is neither in the catalogue nor a user's spec file (a ``.toml``/``.json``
        path, or a name in the files of ``$PDOPT_SPECS``: :mod:`pdopt._specs_file`); the message
        lists the known names.

    Examples
    --------
    >>> get_gpu("a100-80gb").peak_flops
    312000000000000.0
    """
    from pdopt._specs_file import env_spec, user_spec

    key = str(name).strip().lower()
    by_lower = {gpu_name.lower(): gpu_name for gpu_name in GPUS}
    resolved = by_lower.get(key) or _ALIASES.get(key)
    if resolved is None:
        bare = next((key[len(p) :] for p in _DEVICE_PREFIXES if key.startswith(p)), None)
        if bare:
            resolved = by_lower.get(bare) or _ALIASES.get(bare)
    if resolved is None:  # a user's spec file, or a name from $PDOPT_SPECS (pdopt._specs_file)
        return user_spec("gpu", name, GpuSpec, sorted(GPUS))
    # a $PDOPT_SPECS entry of a catalogued name replaces the row (pdopt._specs_file.env_spec)
    return env_spec("gpu", (str(name), resolved), GpuSpec) or GPUS[resolved]
