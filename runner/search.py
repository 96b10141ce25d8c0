"""Pure bisect engine. Placeholder: see tests/test_search.py for the contract."""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"
