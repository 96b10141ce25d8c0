"""Choosing a round's tests: pure functions of the recorded verdicts, as `search.py` is.

The session asks these what a round of k tests should be and what its outcomes could be; they
know nothing of git, Docker or the clock, so a resumed session picks what an uninterrupted one
would, and `tests/test_rounds.py` checks them against brute force with hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from runner.confidence import Belief, boundary_runs
from runner.search import Step, Test, Verdict, bounds, next_step

Policy = Literal["any-fail", "majority"]
"""How `--repeat` runs of one commit make its verdict."""


def verdicts_of(
    observations: Mapping[int, Sequence[Verdict]], repeat: int | None, policy: Policy
) -> dict[int, Verdict]:
    """One verdict per tested index: `policy`'s over its runs with `--repeat`, else the
    majority's (what plain bisection and the reports go by)."""
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


def repeat_round(
    count: int,
    observations: Mapping[int, Sequence[Verdict]],
    *,
    k: int,
    repeat: int,
    policy: Policy,
    pivot: Callable[[Mapping[int, Verdict], int], int],
) -> Step:
    """`--repeat`: commits still short of their runs first (as many runs as they lack), then
    plain bisection over the complete verdicts, k // repeat new commits a round (at least one)
    with all their runs in it. `pivot` may move a lone pick (see `cache_aware`)."""
    complete = {
        index: verdict
        for index, verdict in verdicts_of(observations, repeat, policy).items()
        if len(observations[index]) >= repeat or verdict is Verdict.SKIP
    }
    short = [
        index
        for index, seen in sorted(observations.items())
        if index not in complete
        for _ in range(repeat - len(seen))
    ]
    if short:
        return Test(tuple(short[:k]))
    step = next_step(count, complete, parallel=max(1, k // repeat))
    if not isinstance(step, Test):
        return step
    indices = step.indices
    if len(indices) == 1:
        indices = (pivot(complete, indices[0]),)
    runs = [i for i in indices for _ in range(repeat - len(observations.get(i, [])))]
    return Test(tuple(runs[:k]))


def posterior_round(
    posterior: Belief, first: int, *, k: int, last_good_runs: int, plain: int | None
) -> Test:
    """A round of k tests from the posterior, `first` being the confidence search's own pick.

    Once a boundary is likely, the runs it still needs before it can be reported share one
    round (the same commit perhaps twice) and spare devices cut the posterior; until then the
    k quantile cuts."""
    runs = boundary_runs(posterior, last_good_runs, plain)[:k]
    if runs and posterior.top_block[2] >= 0.5:
        extra = [i for i in quantile_picks(posterior, runs[0], k) if i not in runs]
        return Test(tuple(runs + extra)[:k])
    return Test(quantile_picks(posterior, first, k))


def cache_aware(
    count: int, verdicts: Mapping[int, Verdict], pick: int, cached: Callable[[int], bool]
) -> int:
    """A neighbour of the ideal pivot whose wheels are built already (`cached`), when testing
    it costs no extra step in the worst case; else the pick."""
    if pick in verdicts or not 0 < pick < count - 1 or cached(pick):
        return pick
    lo, hi = bounds(count, verdicts)
    if not lo < pick < hi:
        return pick
    worst = worst_case_after(lo, hi, pick)
    for neighbour in (pick - 1, pick + 1):
        if (
            lo < neighbour < hi
            and neighbour not in verdicts
            and worst_case_after(lo, hi, neighbour) <= worst
            and cached(neighbour)
        ):
            return neighbour
    return pick
