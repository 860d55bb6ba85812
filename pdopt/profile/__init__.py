"""Profile files: measured or roofline latencies of one GPU × model × TP."""

from pdopt.profile._aic import import_aic
from pdopt.profile._calibrate import (
    ComputeCalibration,
    calibrate_compute_efficiency,
    gemm_compute_efficiency,
)
from pdopt.profile._format import (
    LEGACY_COLUMNS,
    PROFILE_COLUMNS,
    REQUIRED_FIELDS,
    ROW_KINDS,
    Profile,
    ProfileMeta,
)
from pdopt.profile._io import format_profile, profile_from_records, read_profile, write_profile
from pdopt.profile._knobs import (
    PRESET_GEMM_EFFICIENCY,
    ROOFLINE_PRESETS,
    RooflineKnobs,
    roofline_knobs,
)
from pdopt.profile._roofline import roofline_profile
from pdopt.profile._vidur import import_vidur

__all__ = [
    "LEGACY_COLUMNS",
    "PRESET_GEMM_EFFICIENCY",
    "PROFILE_COLUMNS",
    "REQUIRED_FIELDS",
    "ROOFLINE_PRESETS",
    "ROW_KINDS",
    "ComputeCalibration",
    "Profile",
    "ProfileMeta",
    "RooflineKnobs",
    "calibrate_compute_efficiency",
    "format_profile",
    "gemm_compute_efficiency",
    "import_aic",
    "import_vidur",
    "profile_from_records",
    "read_profile",
    "roofline_knobs",
    "roofline_profile",
    "write_profile",
]
