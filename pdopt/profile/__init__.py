"""Profile files: measured or roofline latencies of one GPU × model × TP."""

from pdopt.profile._aic import import_aic
from pdopt.profile._format import (
    LEGACY_COLUMNS,
    PROFILE_COLUMNS,
    REQUIRED_FIELDS,
    ROW_KINDS,
    Profile,
    ProfileMeta,
)
from pdopt.profile._io import format_profile, profile_from_records, read_profile, write_profile
from pdopt.profile._knobs import ROOFLINE_PRESETS, RooflineKnobs, roofline_knobs
from pdopt.profile._roofline import roofline_profile
from pdopt.profile._vidur import import_vidur

__all__ = [
    "LEGACY_COLUMNS",
    "PROFILE_COLUMNS",
    "REQUIRED_FIELDS",
    "ROOFLINE_PRESETS",
    "ROW_KINDS",
    "Profile",
    "ProfileMeta",
    "RooflineKnobs",
    "format_profile",
    "import_aic",
    "import_vidur",
    "profile_from_records",
    "read_profile",
    "roofline_knobs",
    "roofline_profile",
    "write_profile",
]
