"""Small helpers for the sentences the tool prints."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 entry`, `2 entries`: the count with its noun in the right number."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {plural or noun + 's'}"
