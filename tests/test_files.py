"""Whole-or-nothing writes of the workdir's files (settings.json, reports, the metrics plot)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from runner.files import write_atomic, write_text_atomic


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temporary_one(tmp_path: Path):
    """A full disk left settings.json.tmp (and an empty metrics.tmp.png) in the workdir for
    good; the file it replaces stays as it was."""
    target = tmp_path / "settings.json"
    target.write_text("old\n")

    def fills_the_disk(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, fills_the_disk)

    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
    write_text_atomic(target, "new \udcff\n")  # a lone surrogate from a log: replaced, not lost
    assert target.read_text() == "new ?\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]
