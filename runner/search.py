"""The bisect engine: given the verdicts known so far, say what to test next or what the answer is.

It is pure on purpose (no git, no Docker, no clock, no printing): a bisect that runs for hours
must be resumable from the ledger alone, so the next step has to be a function of the recorded
verdicts and nothing else. Purity also lets hypothesis check the engine against a brute-force
oracle over thousands of histories in a second, which no Docker-backed test could do.

Candidates are the indices ``0..count-1`` of one ordered history. Index 0 is the known-good
endpoint and ``count-1`` the known-bad one; both are taken as given (the session verifies them
before bisecting), so verdicts recorded for them never move the search.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


@dataclass(frozen=True)
class Test:
    """Test these indices next, most informative first (one per free device)."""

    __test__ = False  # not a pytest test class, despite the name

    indices: tuple[int, ...]


@dataclass(frozen=True)
class Found:
    """The first bad candidate: ``index - 1`` is known good and ``index`` known bad."""

    index: int


@dataclass(frozen=True)
class Inconclusive:
    """Skipped candidates border the culprit, so it is one of ``first..last`` (inclusive).

    ``first - 1`` is known good, ``last`` is known bad and ``first..last-1`` all could not be
    judged; no further test inside the history can narrow it down.
    """

    first: int
    last: int


Step = Test | Found | Inconclusive


def bounds(count: int, verdicts: Mapping[int, Verdict]) -> tuple[int, int]:
    """Return ``(lo, hi)``: the last known-good index below the first known-bad index ``hi``.

    The first BAD wins and GOODs above it are ignored, so contradictory (non-monotone) data
    narrows the search to a real good→bad transition instead of raising.
    """
    known = _checked(count, verdicts)
    hi = min((i for i, v in known.items() if v is Verdict.BAD and i > 0), default=count - 1)
    lo = max((i for i, v in known.items() if v is Verdict.GOOD and i < hi), default=0)
    return lo, hi


def untested(count: int, verdicts: Mapping[int, Verdict]) -> tuple[int, ...]:
    """Indices strictly between the bounds that have no verdict yet, in history order."""
    lo, hi = bounds(count, verdicts)
    return tuple(i for i in range(lo + 1, hi) if i not in verdicts)


def steps_left(count: int, verdicts: Mapping[int, Verdict], parallel: int = 1) -> int:
    """Estimate the tests (or, with ``parallel`` devices, rounds) still needed, assuming no skips.

    Exact for a skip-free history: each round splits the ``n`` untested candidates into
    ``parallel + 1`` parts, so ``ceil(log_{parallel+1}(n + 1))`` rounds remain.
    """
    _check_parallel(parallel)
    remaining = len(untested(count, verdicts)) + 1
    rounds, reach = 0, 1
    while reach < remaining:
        rounds, reach = rounds + 1, reach * (parallel + 1)
    return rounds


def next_step(count: int, verdicts: Mapping[int, Verdict], parallel: int = 1) -> Step:
    """Decide what to do next: test more candidates, or report the culprit or the skipped stretch.

    With one device the pick is the midpoint of the bounds, or when that was skipped the nearest
    untested index alternating sides, so a broken stretch is probed from its middle outwards
    rather than walked end to end. With ``parallel`` devices the untested candidates are split
    into ``parallel + 1`` near-equal parts, so every round shrinks the range by that factor.
    """
    _check_parallel(parallel)
    lo, hi = bounds(count, verdicts)
    open_ = untested(count, verdicts)
    if not open_:
        return Found(hi) if hi == lo + 1 else Inconclusive(lo + 1, hi)
    if parallel == 1:
        return Test((_nearest_untested((lo + hi) // 2, lo, hi, verdicts),))
    return Test(_split(open_, parallel))


def _split(open_: tuple[int, ...], parallel: int) -> tuple[int, ...]:
    """Pick ``parallel`` indices cutting ``open_`` into ``parallel + 1`` near-equal parts.

    Cut ``j`` sits at position ``floor(j * (n + 1) / (parallel + 1))`` (1-based) among the ``n``
    untested candidates, so no part is larger than ``ceil((n + 1) / (parallel + 1))`` and the
    cuts are distinct. The middle cuts come first: if fewer devices are free, they matter most.
    """
    n = len(open_)
    if n <= parallel:
        cuts = list(range(1, n + 1))
    else:
        cuts = [j * (n + 1) // (parallel + 1) for j in range(1, parallel + 1)]
    middle = cuts[(len(cuts) - 1) // 2]
    cuts.sort(key=lambda c: (abs(c - middle), c))
    return tuple(open_[c - 1] for c in cuts)


def _nearest_untested(m: int, lo: int, hi: int, verdicts: Mapping[int, Verdict]) -> int:
    for i in _outwards(m, lo, hi):
        if i not in verdicts:
            return i
    raise AssertionError("caller guarantees an untested index between the bounds")


def _outwards(m: int, lo: int, hi: int) -> Iterator[int]:
    """Yield ``m, m+1, m-1, m+2, m-2, ...`` limited to the open interval ``(lo, hi)``."""
    yield m
    for d in range(1, hi - lo):
        if m + d < hi:
            yield m + d
        if m - d > lo:
            yield m - d


def _checked(count: int, verdicts: Mapping[int, Verdict]) -> dict[int, Verdict]:
    """Validate the arguments and normalise verdicts (a ledger may hand over plain strings)."""
    if count < 2:
        raise ValueError(f"a bisect needs at least 2 candidates (good and bad), got count={count}")
    known: dict[int, Verdict] = {}
    for i, v in verdicts.items():
        if not 0 <= i < count:
            raise ValueError(f"verdict for index {i} is outside the candidates 0..{count - 1}")
        known[i] = Verdict(v)
    return known


def _check_parallel(parallel: int) -> None:
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1 device, got {parallel}")
