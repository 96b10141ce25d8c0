"""Files written whole or not at all: a reader (or a run after a full disk) never finds half of
one, and a failed write leaves no temporary file behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, write: Callable[[Path], object], suffix: str = ".tmp") -> None:
    """Let `write` fill a temporary file beside `path`, then put it in place in one rename; the
    temporary file is removed when anything fails (a full disk, say)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomic(path: Path, text: str) -> None:
    # errors="replace": a report quoting odd bytes of a log is still written whole
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8", errors="replace"))
