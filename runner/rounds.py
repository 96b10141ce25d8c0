"""Choosing a round's tests: pure functions of the recorded verdicts, as `search.py` is.

The session asks these what a round of k tests should be and what its outcomes could be; they
know nothing of git, Docker or the clock, so a resumed session picks what an uninterrupted one
would, and `tests/test_rounds.py` checks them against brute force with hypothesis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from runner.confidence import Belief
from runner.search import Verdict

Policy = Literal["any-fail", "majority"]
"""How `--repeat` runs of one commit make its verdict."""


def verdicts_of(
    observations: Mapping[int, Sequence[Verdict]], repeat: int | None, policy: Policy
) -> dict[int, Verdict]:
    out: dict[int, Verdict] = {}
    for index, seen in observations.items():
        verdict = aggregate(seen, policy if repeat else "majority")
        if verdict is not None:
            out[index] = verdict
    return out


def with_outcome(
    observations: Mapping[int, Sequence[Verdict]],
    indices: Sequence[int],
    outcome: Sequence[Verdict],
) -> dict[int, list[Verdict]]:
    """A copy of `observations` with one more verdict per tested index."""
    out = {index: list(seen) for index, seen in observations.items()}
    for index, verdict in zip(indices, outcome, strict=True):
        out.setdefault(index, []).append(verdict)
    return out


def round_outcomes(indices: Sequence[int]) -> list[tuple[Verdict, ...]]:
    """The outcomes of a round a monotone history allows, the middle boundary first: with the
    indices sorted, the first j pass and the rest fail."""
    order = sorted(range(len(indices)), key=lambda i: indices[i])
    found = []
    for passing in range(len(indices) + 1):
        verdicts = [Verdict.BAD] * len(indices)
        for position in order[:passing]:
            verdicts[position] = Verdict.GOOD
        found.append(tuple(verdicts))
    middle = len(found) // 2
    return sorted(found, key=lambda o: abs(found.index(o) - middle))


def worst_case_after(lo: int, hi: int, pick: int) -> int:
    """Tests a plain bisection of (lo, hi) needs at most after testing `pick` (no skips)."""

    def steps(untested: int) -> int:
        return max(0, untested).bit_length()  # ceil(log2(untested + 1))

    return 1 + max(steps(pick - lo - 1), steps(hi - pick - 1))


def quantile_picks(posterior: Belief, first: int, k: int) -> tuple[int, ...]:
    """k indices that cut the posterior over the first bad commit into k + 1 equal parts.

    Testing index i tells hypotheses h <= i (i is bad) from h > i (i is good), so the cut
    nearest mass j/(k+1) is the index whose cumulative probability is closest to it. On a
    deterministic example this is the plain k-way split; with flakes the cuts crowd the likely
    boundary and may repeat a tested commit, which is what a noisy test needs. The single best
    pick (`first`) leads when it re-tests an endpoint: the flake rates are still unknown.
    Untestable candidates (a skip) are never picked: a cut that lands on one moves to the
    nearest testable candidate.
    """
    probabilities = posterior.probabilities
    count = len(probabilities)
    untestable = {i for i, tally in posterior.tallies.items() if tally.skip}
    picks: list[int] = [first] if first in (0, count - 1) else []
    cumulative = []
    total = 0.0
    for index in range(count - 1):  # testing the bad endpoint splits nothing
        total += probabilities[index]
        if index not in untestable:
            cumulative.append((index, total))
    for cut in range(1, k + 1):
        target = cut / (k + 1)
        index, _ = min(cumulative, key=lambda c: (abs(c[1] - target), c[0]))
        if index > 0 and index not in picks:
            picks.append(index)
    # A posterior piled on one boundary gives fewer distinct cuts than devices: fill with the
    # best single pick, then both sides of the likeliest boundaries (last good, first bad).
    fill = [first]
    for hypothesis, _p in posterior.ranked(mass=1.0, limit=k + 2):
        fill += [hypothesis - 1, hypothesis]
    for index in fill:
        if len(picks) >= k:
            break
        if 0 <= index < count and index not in picks and index not in untestable:
            picks.append(index)
    return tuple(picks[:k])


def aggregate(seen: Sequence[Verdict], policy: Policy) -> Verdict | None:
    """One verdict from repeated runs: any skip skips; any-fail is bad on one failure; majority
    is bad when failures are at least half (a tie counts as bad, as a regression shows)."""
    verdicts = [Verdict(v) for v in seen]
    if not verdicts:
        return None
    if Verdict.SKIP in verdicts:
        return Verdict.SKIP
    bad = verdicts.count(Verdict.BAD)
    if policy == "any-fail":
        return Verdict.BAD if bad else Verdict.GOOD
    return Verdict.BAD if 2 * bad >= len(verdicts) else Verdict.GOOD
