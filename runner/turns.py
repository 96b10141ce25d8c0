"""One holder at a time, and the work a test waits for goes before work done ahead of need.

Builds ahead of need (speculative wheels and test images) share a few serialised resources with
the tests of the current round: the process's image builds, and the git mirrors that sources
are exported from. A plain lock serves them in arrival order, so a round whose prefetch started
first waited behind every guess; `Turns` lets a needed holder overtake waiting guesses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Turns:
    """A lock whose needed waiters go before speculative ones (a guess never preempts)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._needed_waiting = 0

    @contextlib.contextmanager
    def turn(self, speculative: bool = False) -> Iterator[None]:
        with self._cond:
            self._needed_waiting += not speculative
            while self._busy or (speculative and self._needed_waiting):
                self._cond.wait()
            self._needed_waiting -= not speculative
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
