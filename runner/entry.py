"""The console script. A stop that comes while the tool is still importing its modules (Ctrl-C,
or a CI cancel's SIGTERM, in its first half second) ends it as any other stop does: exit 130
and one line, not a traceback of the import under way, nor death by the signal."""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _stop)  # the command line sets its own before any work
    try:
        from runner.cli import app
    except KeyboardInterrupt:
        os.write(2, b"interrupted\n")
        sys.exit(INTERRUPTED)
    app()
