"""The GPU catalogue: names, lookup, and data-sheet values that other numbers rest on."""

from __future__ import annotations

import pytest

from pdopt.errors import ParameterError
from pdopt.hardware import GPUS, GpuSpec, get_gpu

EXPECTED_NAMES = [
    "V100-32GB", "A100-80GB", "A800-80GB", "H100-SXM", "H800", "H200", "L20",
    "B200", "H20", "L40S", "L4", "A10G", "MI300X",
]  # fmt: skip


def test_catalogue_holds_the_seed_papers_gpus() -> None:
    assert list(GPUS) == EXPECTED_NAMES
    assert all(isinstance(gpu, GpuSpec) and gpu.name == name for name, gpu in GPUS.items())


@pytest.mark.parametrize("name", ["a100-80gb", "A100-80GB", " a100 ", "A100"])
def test_get_gpu_is_case_insensitive_with_aliases(name: str) -> None:
    assert get_gpu(name) is GPUS["A100-80GB"]


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(ParameterError) as info:
        get_gpu("TPU-v5")
    assert str(info.value).startswith(
        f"unknown GPU 'TPU-v5': expected one of {sorted(GPUS)}, a GPU spec file"
    )


@pytest.mark.parametrize(
    ("name", "tflops", "memory_mib", "hbm_tb_s"),
    [
        ("V100-32GB", 125.0, 32 * 1024, 0.9),
        ("A100-80GB", 312.0, 80 * 1024, 2.039),
        ("A800-80GB", 312.0, 80 * 1024, 2.039),
        ("H100-SXM", 989.5, 80 * 1024, 3.35),
        ("H800", 989.5, 80 * 1024, 3.35),
        ("H200", 989.5, 141 * 1024, 4.8),
        ("L20", 119.5, 46068, 0.864),
        ("B200", 2250.0, 180 * 1024, 7.7),
        ("H20", 148.0, 96 * 1024, 4.0),
        ("L40S", 362.05, 46068, 0.864),
        ("L4", 121.0, 23034, 0.3),
        ("A10G", 125.0, 23028, 0.6),
        ("MI300X", 1307.4, 192 * 1024, 5.3),
    ],
)
def test_data_sheet_values(name: str, tflops: float, memory_mib: int, hbm_tb_s: float) -> None:
    # HBM boards: the marketed GiB; GDDR6 boards: nvidia-smi's total with their default ECC on
    # (1/16 held back: 46068 MiB on the 48 GB boards, not 49152).
    gpu = get_gpu(name)
    assert gpu.peak_flops == pytest.approx(tflops * 1e12)
    assert gpu.memory_bytes == memory_mib * 2**20
    assert gpu.hbm_bw_bytes_per_s == pytest.approx(hbm_tb_s * 1e12)


def test_export_variants_have_capped_links() -> None:
    # A800 and H800 are the A100 and H100 with NVLink capped at 400 GB/s bidirectional.
    assert get_gpu("A800-80GB").link_bw_bytes_per_s < get_gpu("A100-80GB").link_bw_bytes_per_s
    assert get_gpu("H800").link_bw_bytes_per_s < get_gpu("H100-SXM").link_bw_bytes_per_s
    assert get_gpu("L20").link_bw_bytes_per_s == 32e9  # PCIe Gen4 x16, one direction


def test_power_and_cost_are_sane() -> None:
    for gpu in GPUS.values():
        assert 0 < gpu.idle_power_w < gpu.max_power_w
        assert gpu.cost_per_hour > 0


def test_gpu_spec_rejects_bad_values() -> None:
    with pytest.raises(ParameterError, match="'peak_flops' parameter of GpuSpec"):
        GpuSpec("x", -1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def test_tensor_parallelism_stays_within_one_node() -> None:
    """Every catalogued board sits 8 to a node; a TP group beyond it would all-reduce over the
    network between nodes, which the roofline does not price, so it is refused by name."""
    import dataclasses

    from pdopt.errors import ParameterError
    from pdopt.profile import roofline_profile

    assert {gpu.gpus_per_node for gpu in GPUS.values()} == {8}
    h100 = get_gpu("H100-SXM")
    assert h100.check_tp(8, "x") == 8
    with pytest.raises(ParameterError, match="at most H100-SXM's gpus_per_node=8"):
        roofline_profile(h100, "Llama-3.1-70B", 16)
    # A board whose node holds more (an NVL72 rack, say, in a spec file) may go wider.
    wide = dataclasses.replace(h100, gpus_per_node=16)
    assert len(roofline_profile(wide, "Llama-3.1-70B", 16).rows)
    with pytest.raises(ParameterError, match="gpus_per_node"):
        dataclasses.replace(h100, gpus_per_node=0)


@pytest.mark.parametrize(
    ("device_name", "catalogued"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_device_names_that_torch_reports_resolve(device_name: str, catalogued: str) -> None:
    # a measured profile's `# gpu:` line is torch.cuda.get_device_name()
    assert get_gpu(device_name).name == catalogued


def test_a_device_name_of_another_board_is_not_coerced() -> None:
    with pytest.raises(ParameterError, match="NVIDIA H100 PCIe"):
        get_gpu("NVIDIA H100 PCIe")  # PCIe: other clocks and bandwidth than the SXM board
