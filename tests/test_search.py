"""The pure bisect engine, checked against a brute-force oracle over random monotone histories."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.search import (
    Found,
    Inconclusive,
    Step,
    Test,
    Verdict,
    bounds,
    next_step,
    steps_left,
    untested,
)


@dataclass(frozen=True)
class History:
    """A linear history that turns bad at ``first_bad``; ``skipped`` commits cannot be judged."""

    count: int
    first_bad: int
    skipped: frozenset[int] = frozenset()

    def verdict(self, index: int) -> Verdict:
        if index in self.skipped:
            return Verdict.SKIP
        return Verdict.GOOD if index < self.first_bad else Verdict.BAD

    def oracle(self) -> Step:
        """What a bisect must conclude, worked out by looking at every commit."""
        first = 1 + max(i for i in range(self.first_bad) if i not in self.skipped)
        last = min(i for i in range(self.first_bad, self.count) if i not in self.skipped)
        return Found(last) if first == last else Inconclusive(first, last)


@dataclass
class Run:
    outcome: Step
    rounds: int = 0
    visited: list[int] = field(default_factory=list)


def bisect(history: History, parallel: int = 1) -> Run:
    """Drive the engine to its conclusion, answering every offered index from the history.

    Checks on every round what any caller relies on: the offered indices are distinct, untested,
    strictly inside the bounds, and as many as there are devices (or untested candidates).
    """
    verdicts: dict[int, Verdict] = {}
    run = Run(outcome=Test(()))
    for _ in range(history.count):
        step = next_step(history.count, verdicts, parallel)
        if not isinstance(step, Test):
            run.outcome = step
            return run
        lo, hi = bounds(history.count, verdicts)
        open_ = [i for i in range(lo + 1, hi) if i not in verdicts]
        assert len(step.indices) == min(parallel, len(open_))
        assert len(set(step.indices)) == len(step.indices)
        assert set(step.indices) <= set(open_)
        run.rounds += 1
        run.visited.extend(step.indices)
        for i in step.indices:
            verdicts[i] = history.verdict(i)
    raise AssertionError(f"no conclusion after {history.count} rounds: {run.visited}")


@st.composite
def histories(draw: st.DrawFn, skips: bool = True) -> History:
    count = draw(st.integers(2, 200))
    first_bad = draw(st.integers(1, count - 1))
    skipped: set[int] = set()
    if skips and count > 2:
        skipped = draw(st.sets(st.integers(1, count - 2), max_size=count - 2))
        if draw(st.booleans()):  # a broken stretch, the way real build breakages come
            start = draw(st.integers(1, count - 2))
            length = draw(st.integers(1, 15))
            skipped |= set(range(start, min(start + length, count - 1)))
    return History(count, first_bad, frozenset(skipped))


@settings(max_examples=400)
@given(histories())
def test_a_single_device_reaches_the_oracles_answer(history: History) -> None:
    assert bisect(history).outcome == history.oracle()


@settings(max_examples=300)
@given(histories(skips=False))
def test_without_skips_a_single_device_needs_at_most_log2_of_the_range(history: History) -> None:
    run = bisect(history)
    assert run.outcome == Found(history.first_bad)
    budget = math.ceil(math.log2(history.count - 1))
    assert run.rounds <= budget
    assert steps_left(history.count, {}) == budget


@settings(max_examples=300)
@given(histories(), st.integers(2, 6))
def test_parallel_devices_reach_the_oracles_answer(history: History, parallel: int) -> None:
    assert bisect(history, parallel).outcome == history.oracle()


@settings(max_examples=300)
@given(histories(skips=False), st.integers(2, 6))
def test_without_skips_parallel_devices_never_take_more_rounds_than_one_device(
    history: History, parallel: int
) -> None:
    rounds = bisect(history, parallel).rounds
    assert rounds <= bisect(history).rounds
    assert rounds <= steps_left(history.count, {}, parallel)


@settings(max_examples=200)
@given(histories(skips=False), st.integers(1, 4))
def test_steps_left_never_underestimates_a_skip_free_search(
    history: History, parallel: int
) -> None:
    verdicts: dict[int, Verdict] = {}
    estimates: list[int] = []
    while isinstance(step := next_step(history.count, verdicts, parallel), Test):
        estimates.append(steps_left(history.count, verdicts, parallel))
        verdicts.update((i, history.verdict(i)) for i in step.indices)
    for done, estimate in enumerate(estimates):
        assert len(estimates) - done <= estimate
    assert steps_left(history.count, verdicts, parallel) == 0


def test_a_broken_stretch_at_the_midpoint_is_probed_from_the_middle_outwards() -> None:
    history = History(count=101, first_bad=80, skipped=frozenset(range(45, 55)))
    run = bisect(history)
    assert run.visited[:10] == [50, 51, 49, 52, 48, 53, 47, 54, 46, 55]
    moves = [b - a for a, b in pairwise(run.visited[:9])]
    assert all(x * y < 0 for x, y in pairwise(moves)), "sides must alternate, not walk"
    assert run.outcome == Found(80)


def test_a_culprit_inside_a_broken_stretch_is_reported_as_the_whole_stretch() -> None:
    history = History(count=101, first_bad=50, skipped=frozenset(range(45, 55)))
    assert bisect(history).outcome == Inconclusive(45, 55)
    assert bisect(history, parallel=4).outcome == Inconclusive(45, 55)


def test_adjacent_endpoints_need_no_test() -> None:
    assert next_step(2, {}) == Found(1)
    assert next_step(2, {}, parallel=8) == Found(1)


def test_parallel_cuts_split_the_range_evenly_with_the_middle_cut_first() -> None:
    assert next_step(101, {}, parallel=3) == Test((50, 25, 75))
    assert next_step(101, {}, parallel=2) == Test((33, 66))


def test_parallel_cuts_count_only_untested_candidates() -> None:
    skipped = {i: Verdict.SKIP for i in range(1, 50)}
    # 49 untested remain (50..98), cut into quarters by position among them
    assert next_step(100, skipped, parallel=3) == Test((74, 86, 61))


def test_more_devices_than_untested_candidates_test_everything_left() -> None:
    verdicts = {2: Verdict.GOOD, 6: Verdict.BAD, 4: Verdict.SKIP}
    assert sorted(next_step(10, verdicts, parallel=5).indices) == [3, 5]


def test_bounds_follow_the_first_bad_and_the_last_good_below_it() -> None:
    assert bounds(10, {}) == (0, 9)
    assert bounds(10, {3: Verdict.GOOD, 7: Verdict.BAD, 5: Verdict.SKIP}) == (3, 7)


def test_contradictory_verdicts_narrow_to_a_real_good_to_bad_step() -> None:
    verdicts = {2: Verdict.GOOD, 4: Verdict.BAD, 6: Verdict.GOOD, 8: Verdict.BAD}
    assert bounds(10, verdicts) == (2, 4)
    assert next_step(10, verdicts) == Test((3,))


def test_verdicts_on_the_endpoints_do_not_move_the_search() -> None:
    verdicts = {0: Verdict.BAD, 9: Verdict.GOOD}
    assert bounds(10, verdicts) == (0, 9)
    assert next_step(10, verdicts) == Test((4,))


def test_verdicts_read_back_from_a_ledger_as_plain_strings_are_accepted() -> None:
    assert bounds(10, {3: "good", 7: "bad"}) == (3, 7)  # type: ignore[dict-item]
    assert untested(10, {3: "good", 5: "skip", 7: "bad"}) == (4, 6)  # type: ignore[dict-item]


def test_steps_left_counts_halvings_of_the_untested_candidates() -> None:
    assert steps_left(2, {}) == 0
    assert steps_left(3, {}) == 1
    assert steps_left(1025, {}) == 10
    assert steps_left(1025, {}, parallel=3) == 5
    assert steps_left(10, {i: Verdict.SKIP for i in range(1, 8)}) == 1


@pytest.mark.parametrize(
    ("count", "verdicts", "parallel", "complaint"),
    [
        (1, {}, 1, "at least 2 candidates"),
        (10, {10: Verdict.GOOD}, 1, "outside the candidates"),
        (10, {-1: Verdict.BAD}, 1, "outside the candidates"),
        (10, {}, 0, "at least 1 device"),
        (10, {3: "maybe"}, 1, "maybe"),
    ],
)
def test_bad_arguments_are_refused(
    count: int, verdicts: dict[int, Verdict], parallel: int, complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        next_step(count, verdicts, parallel)
