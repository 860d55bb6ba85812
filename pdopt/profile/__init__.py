"""Profile files: measured or roofline latencies of one GPU × model × TP."""

from pdopt.profile._format import PROFILE_COLUMNS, REQUIRED_FIELDS, ROW_KINDS, Profile, ProfileMeta
from pdopt.profile._io import format_profile, profile_from_records, read_profile, write_profile

__all__ = [
    "PROFILE_COLUMNS",
    "REQUIRED_FIELDS",
    "ROW_KINDS",
    "Profile",
    "ProfileMeta",
    "format_profile",
    "profile_from_records",
    "read_profile",
    "write_profile",
]
