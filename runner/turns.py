"""Needed work shares its turn; work done ahead of need takes its turn alone, after it.

Builds ahead of need (speculative exports and builder lookups) read the same git mirrors as the
tests of the current round. Reading is safe in parallel, but a guess that holds the mirrors (or
the CPU they cost) delays a test, so `Turns` lets the tests of a round hold their turns together
and makes a guess wait until no test holds or wants one: a needed waiter overtakes every waiting
guess, and a guess never preempts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Turns:
    """Needed holders together, or one speculative holder alone; needed waiters go first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._needed = 0  # holding
        self._guessing = False
        self._needed_waiting = 0

    @contextlib.contextmanager
    def turn(self, speculative: bool = False) -> Iterator[None]:
        with self._cond:
            if speculative:
                while self._guessing or self._needed or self._needed_waiting:
                    self._cond.wait()
                self._guessing = True
            else:
                self._needed_waiting += 1
                while self._guessing:
                    self._cond.wait()
                self._needed_waiting -= 1
                self._needed += 1
        try:
            yield
        finally:
            with self._cond:
                if speculative:
                    self._guessing = False
                else:
                    self._needed -= 1
                self._cond.notify_all()
