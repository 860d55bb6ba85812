"""Profile files: measured or roofline latencies of one GPU × model × TP."""

from pdopt.profile._aic import import_aic
from pdopt.profile._format import PROFILE_COLUMNS, REQUIRED_FIELDS, ROW_KINDS, Profile, ProfileMeta
from pdopt.profile._io import format_profile, profile_from_records, read_profile, write_profile
from pdopt.profile._roofline import (
    DEFAULT_BANDWIDTH_EFFICIENCY,
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_OVERHEAD_S,
    roofline_profile,
)
from pdopt.profile._vidur import import_vidur

__all__ = [
    "DEFAULT_BANDWIDTH_EFFICIENCY",
    "DEFAULT_COMPUTE_EFFICIENCY",
    "DEFAULT_OVERHEAD_S",
    "PROFILE_COLUMNS",
    "REQUIRED_FIELDS",
    "ROW_KINDS",
    "Profile",
    "ProfileMeta",
    "format_profile",
    "import_aic",
    "import_vidur",
    "profile_from_records",
    "read_profile",
    "roofline_profile",
    "write_profile",
]
