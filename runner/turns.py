"""Work a test waits for never waits for work done ahead of need; a guess waits for it.

Builds ahead of need (speculative exports, builder lookups, test images) use the same git mirrors
and the same Docker Engine as the tests of the current round. Both are safe to use in parallel,
but a guess that starts beside a test slows it, so `Turns` lets any number of needed holders in
at once, at any time, and lets a guess in only while no needed one holds, one guess at a time. A
guess already in never preempts: it finishes beside the needed holders that came after it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Turns:
    """Needed holders at any time; one speculative holder, only while no needed one holds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._needed = 0
        self._guessing = False

    @contextlib.contextmanager
    def turn(self, speculative: bool = False) -> Iterator[None]:
        with self._cond:
            if speculative:
                self._cond.wait_for(lambda: not self._guessing and not self._needed)
                self._guessing = True
            else:
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
