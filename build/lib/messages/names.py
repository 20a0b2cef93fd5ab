"""The rule for job names, shared by the flow's config and every envelope a party decodes.

A job name becomes a folder name (``runs/<job>``, a party's ``models/<job>``), so it must
never be able to leave that folder: no separators, no leading dot, bounded length.
"""

from __future__ import annotations

import re

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
JOB_NAME_RULE = "1-64 letters, digits, '_', '.', '-', starting with a letter or digit"


def is_job_name(name: object) -> bool:
    """True if ``name`` is a job name that is safe as one folder name."""
    return isinstance(name, str) and JOB_NAME.fullmatch(name) is not None
