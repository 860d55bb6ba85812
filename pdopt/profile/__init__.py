"""Profile files: measured or roofline latencies of one GPU × model × TP."""

from pdopt.profile._format import PROFILE_COLUMNS, REQUIRED_FIELDS, ROW_KINDS, Profile, ProfileMeta

__all__ = ["PROFILE_COLUMNS", "REQUIRED_FIELDS", "ROW_KINDS", "Profile", "ProfileMeta"]
