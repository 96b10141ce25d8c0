"""Rounds of several tests at once, speculative prefetch and cache-aware pivots, decided by the
session on real sample histories (the tester answers from the spec, as in test_session.py)."""

from __future__ import annotations

import heapq
import itertools
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runner.confidence import Belief, belief
from runner.ledger import Attempt
from runner.rounds import cache_aware, quantile_picks, round_outcomes, worst_case_after
from runner.sample.histories import Sample, SampleSpec, make_sample
from runner.search import Found, Test, Verdict, _split, bounds, next_step
from runner.session import EndpointFailure, LevelResult, Request
from tests.fixtures.histories import expected_outcome, monotone, sample_specs
from tests.test_session import (
    EXTRA,
    SMALL,
    Notes,
    SpecTester,
    bisect,
    session_over,
)


class RoundTester(SpecTester):
    """The spec's answers, `parallel` at a time; remembers rounds, prefetches and cache asks."""

    def __init__(self, sample: Sample, parallel: int, cached: Sequence[int] = (), **kw) -> None:
        super().__init__(sample, **kw)
        self.parallel = parallel
        self.rounds: list[list[tuple[str, str, str | None]]] = []
        self.prefetched: list[list[tuple[str, str | None]]] = []
        self.prefetched_at: list[int] = []  # how many rounds had started at each prefetch
        self.cached_pypto = {sample.pypto_shas[i] for i in cached}

    def test_round(
        self, requests: Sequence[Request], done: Callable[[Attempt], None] | None = None
    ) -> list[Attempt]:
        assert len(requests) <= self.parallel
        self.rounds.append([(r.level, r.pypto, r.simpler) for r in requests])
        attempts = []
        for request in requests:
            attempt = self.test(request.level, request.pypto, request.simpler)
            if done is not None:
                done(attempt)
            attempts.append(attempt)
        return attempts

    def prefetch(
        self,
        pairs: Sequence[tuple[str, str | None]],
        testing: Sequence[tuple[str, str | None]] = (),
    ) -> int:
        self.prefetched.append(list(pairs))
        self.prefetched_at.append(len(self.rounds))
        return len(pairs)

    def cached(self, pypto: str, simpler: str | None) -> bool:
        return pypto in self.cached_pypto


def flat(count: int) -> Belief:
    return belief(count, {})


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("count", [5, 9, 30, 101])
def test_quantile_cuts_of_a_fresh_posterior_split_as_well_as_the_plain_k_way_split(count, k):
    def largest_part(cuts: Sequence[int]) -> int:
        """Hypotheses (first bad = 1..count-1) left in the worst outcome of testing `cuts`."""
        edges = [0, *sorted(cuts), count - 1]
        return max(b - a for a, b in itertools.pairwise(edges))

    picks = quantile_picks(flat(count), first=count // 2, k=k)
    open_ = tuple(range(1, count - 1))
    inside = [i for i in picks if i in open_]
    assert len(set(picks)) == len(picks) <= k
    assert len(inside) == min(k, len(open_))  # a spare device may re-test an endpoint
    assert largest_part(inside) == largest_part(_split(open_, k))


def test_outcomes_of_a_round_are_the_monotone_ones_middle_first():
    outcomes = round_outcomes((7, 3))
    assert len(outcomes) == 3
    assert {tuple(v.value for v in o) for o in outcomes} == {
        ("bad", "bad"),
        ("bad", "good"),
        ("good", "good"),
    }
    # (3 good, 7 bad) is the middle boundary: it comes first
    assert tuple(v.value for v in outcomes[0]) == ("bad", "good")


def test_the_likelier_outcome_of_a_round_is_guessed_first(sample_factory):
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), pypto_regression_at=6))
    session = session_over(sample, RoundTester(sample, parallel=1))
    level = LevelResult("pypto", [f"c{i}" for i in range(11)])
    seen = {0: [Verdict.GOOD], 10: [Verdict.BAD]}
    good, bad = (Verdict.GOOD,), (Verdict.BAD,)
    # Ten hypotheses, about equally likely: index 3 is bad under three, index 7 under seven.
    assert session._likeliest_first(level, seen, (3,)) == [good, bad]
    assert session._likeliest_first(level, seen, (7,)) == [bad, good]
    # 3 passes, 7 fails: the boundary in 4..7, likelier than in 1..3 or 8..10
    assert session._likeliest_first(level, seen, (7, 3))[0] == (Verdict.BAD, Verdict.GOOD)


def test_the_worst_case_counts_the_larger_side():
    assert worst_case_after(0, 8, 4) == 1 + 2  # 3 untested on either side
    assert worst_case_after(0, 8, 3) == 1 + 3  # 4 untested above
    assert worst_case_after(0, 9, 4) == worst_case_after(0, 9, 5)  # both leave at most 4


@given(
    count=st.integers(min_value=2, max_value=300),
    culprit=st.data(),
    cached=st.sets(st.integers(min_value=0, max_value=299)),
)
def test_pivots_moved_to_cached_neighbours_keep_plain_bisections_answer_and_worst_case(
    count, culprit, cached
):
    """However the wheel cache looks, a bisection whose every pivot goes through `cache_aware`
    names the first bad commit within plain bisection's worst case, ceil(log2(count - 1))."""
    first_bad = culprit.draw(st.integers(min_value=1, max_value=count - 1))
    verdicts: dict[int, Verdict] = {}
    tests = 0
    while isinstance(step := next_step(count, verdicts), Test):
        (pick,) = step.indices
        moved = cache_aware(count, verdicts, pick, cached.__contains__)
        if moved != pick:
            lo, hi = bounds(count, verdicts)
            assert abs(moved - pick) == 1 and moved in cached and pick not in cached
            assert worst_case_after(lo, hi, moved) <= worst_case_after(lo, hi, pick)
        verdicts[moved] = Verdict.BAD if moved >= first_bad else Verdict.GOOD
        tests += 1
    assert step == Found(first_bad)
    assert tests <= (count - 2).bit_length()


@pytest.mark.parametrize("k", [2, 3])
def test_a_pypto_regression_on_k_devices_takes_about_log_k_plus_1_rounds(sample_factory, k):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 26}, bumps=((4, 4),), pypto_regression_at=17)
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=k)

    outcome, _ = bisect(sample, tester=tester)

    assert outcome.pypto.first_bad == sample.pypto_shas[17]
    plain = math.ceil(math.log(26, k + 1))
    # endpoints (a round each) and the confidence re-tests come on top, as with one device
    assert outcome.pypto.rounds <= plain + 2 + EXTRA
    one, _ = bisect(sample, tester=RoundTester(sample, parallel=1))
    assert outcome.pypto.rounds < one.pypto.rounds
    assert all(len(r) <= k for r in tester.rounds)
    assert any(len(r) == k for r in tester.rounds)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=sample_specs())
def test_any_monotone_history_on_two_devices_gives_the_brute_force_answer(spec):
    assume(monotone(spec))
    with tempfile.TemporaryDirectory() as tmp:
        sample = make_sample(Path(tmp), spec)
        outcome, _ = bisect(sample, tester=RoundTester(sample, parallel=2))

    source, culprit, state = expected_outcome(spec)
    assert outcome.pypto.first_bad == sample.pypto_shas[culprit]
    assert outcome.source == source
    if state is not None:
        assert outcome.simpler.first_bad == sample.simpler_shas[state]


def named_both_at_4(outcome, sample: Sample) -> bool:
    """Whether a run named pypto commit 4 and simpler commit 4 (exit 0); an answer with exit 0
    must hold the confidence, right or wrong."""
    if outcome.exit_code == 0:
        assert outcome.pypto.probability >= 0.95
    return (
        outcome.exit_code == 0
        and outcome.pypto.first_bad == sample.pypto_shas[4]
        and outcome.simpler_culprit == sample.simpler_shas[4]
    )


def test_a_flaky_example_on_two_devices_still_finds_both_culprits(sample_factory):
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 7),), simpler_regression_at=4))
    right = 0
    for seed in range(10):
        tester = RoundTester(sample, parallel=2, false_fail=0.1, false_pass=0.1, seed=seed)
        outcome, _ = bisect(sample, tester=tester)
        right += named_both_at_4(outcome, sample)
    assert right >= 9


@pytest.mark.parametrize(("repeat", "parallel"), [(3, 3), (2, 3), (3, 2)])
def test_fixed_repeats_fill_a_round_with_the_runs_a_commit_still_lacks(
    sample_factory, repeat, parallel
):
    """`--repeat N` is N runs of each tested commit, whatever the devices: the endpoints and the
    drift check once ran one more on the spare devices, and a majority counted it."""
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), pypto_regression_at=6))
    tester = RoundTester(sample, parallel=parallel)

    outcome, _ = bisect(sample, tester=tester, repeat=repeat, policy="majority")

    assert outcome.pypto.first_bad == sample.pypto_shas[6]
    runs = {pair: tester.tested.count(pair) for pair in set(tester.tested)}
    # N for a commit, 2N for the two the drift check runs again (the known-good and last good)
    assert runs and all(n in (repeat, 2 * repeat) for n in runs.values()), runs
    assert sum(n == 2 * repeat for n in runs.values()) <= 2, runs
    if repeat == parallel:  # every commit's runs share one round
        assert any(len(set(r)) == 1 and len(r) == repeat for r in tester.rounds)


def test_while_a_round_runs_both_next_pivots_are_prefetched_first(sample_factory):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 16}, bumps=((4, 4),), pypto_regression_at=11)
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=1)

    bisect(sample, tester=tester, verify=False)

    first_round = tester.rounds[0]
    tested = sample.pypto_shas.index(first_round[0][1])
    prefetched = [sample.pypto_shas.index(p) for p, _ in tester.prefetched[0]]
    below, above = (0 + tested) // 2, (tested + 16) // 2
    assert set(prefetched[:2]) <= set(range(below - 1, below + 2)) | set(
        range(above - 1, above + 2)
    )
    assert len(set(prefetched[:2])) == 2
    assert prefetched[0] < tested < prefetched[1] or prefetched[1] < tested < prefetched[0]
    assert len(prefetched) >= 4  # then the round after those


@pytest.mark.parametrize("parallel", [1, 2])
def test_while_the_endpoints_are_checked_the_first_bisect_round_is_built_ahead(
    sample_factory, parallel
):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 16}, bumps=((4, 4),), pypto_regression_at=11)
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=parallel)

    bisect(sample, tester=tester)

    endpoints = {sample.pypto_shas[0], sample.pypto_shas[-1]}
    checks = [n for n, r in enumerate(tester.rounds) if {p for _, p, _ in r} <= endpoints]
    first_bisect = next(n for n in range(len(tester.rounds)) if n not in checks)
    # The guesses given while the last endpoint check ran lead with what the next round tested.
    guesses = tester.prefetched[checks[-1]]
    tested = [(p, s) for _, p, s in tester.rounds[first_bisect]]
    assert guesses[: len(tested)] == tested
    assert len(tester.prefetched) == len(tester.rounds)  # every round, the checks included


def test_on_one_device_the_bad_end_is_built_ahead_first_while_the_good_end_runs(
    sample_factory,
):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 16}, bumps=((4, 4),), pypto_regression_at=11)
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=1)

    bisect(sample, tester=tester)

    good, bad = sample.pypto_shas[0], sample.pypto_shas[-1]
    assert [p for _, p, _ in tester.rounds[0]] == [good]
    assert [p for _, p, _ in tester.rounds[1]] == [bad]
    guesses = tester.prefetched[0]
    assert guesses[0] == (bad, sample.gitlink(16))  # due whatever the good end gives
    # then the first bisect round, as the guesses given while the bad end runs lead with
    assert guesses[1] == tester.prefetched[1][0]


@pytest.mark.parametrize(
    "extra",
    [
        {"bumps": ((4, 4), (12, 9)), "simpler_regression_at": 7},
        {
            "bumps": ((4, 4), (12, 9)),
            "code_with_bump": frozenset({12}),
            "simpler_regression_at": 7,
        },
    ],
    ids=["pointer-bump", "code-bump"],
)
def test_the_first_round_inside_a_bump_is_built_ahead_while_the_pypto_level_ends(
    sample_factory, extra
):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 16, "simpler_commits": 12}, **extra)
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=1)

    outcome, _ = bisect(sample, tester=tester)

    assert outcome.simpler_culprit == sample.simpler_shas[7]
    levels = [r[0][0] for r in tester.rounds]
    inside = levels.index("simpler")  # the chain's first round (after the split's halves)
    assert levels[inside - 1] != "simpler"
    # (guesses given while an earlier round ran; the split's rounds give none)
    earlier = [
        g for n, g in zip(tester.prefetched_at, tester.prefetched, strict=True) if n < inside
    ]
    guessed = [pair for guesses in earlier for pair in guesses]
    first = [(p, s) for _, p, s in tester.rounds[inside]]
    assert set(first) <= set(guessed)
    if spec.code_with_bump:
        halves = [(p, s) for r in tester.rounds if r[0][0] == "split" for _, p, s in r]
        assert len(halves) == 2 and set(halves) <= set(guessed)


def test_a_cached_neighbour_of_the_pivot_is_tested_when_it_costs_no_worst_case_step(
    sample_factory,
):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 9}, bumps=((4, 4),), pypto_regression_at=7)
    sample = sample_factory(spec)
    # candidates 0..9: first pivot 4; 3 and 5 leave the same worst case (4 untested at most)
    plain = RoundTester(sample, parallel=1)
    bisect(sample, tester=plain, verify=False)
    assert sample.pypto_shas.index(plain.rounds[0][0][1]) == 4

    with_cache = RoundTester(sample, parallel=1, cached=[5])
    outcome, _ = bisect(sample, tester=with_cache, verify=False)

    assert sample.pypto_shas.index(with_cache.rounds[0][0][1]) == 5
    assert outcome.pypto.first_bad == sample.pypto_shas[7]


def test_a_cached_neighbour_that_would_cost_a_worst_case_step_is_not_taken(sample_factory):
    spec = SampleSpec(**{**SMALL, "pypto_commits": 8}, bumps=((4, 4),), pypto_regression_at=6)
    sample = sample_factory(spec)
    # candidates 0..8: pivot 4 leaves 3 on each side; 3 or 5 would leave 4 (one step more)
    tester = RoundTester(sample, parallel=1, cached=[3, 5])

    bisect(sample, tester=tester, verify=False)

    assert sample.pypto_shas.index(tester.rounds[0][0][1]) == 4


def test_on_two_devices_the_endpoints_the_split_halves_and_the_drift_reruns_share_rounds(
    sample_factory,
):
    spec = SampleSpec(
        **SMALL, bumps=((4, 6),), code_with_bump=frozenset({4}), simpler_regression_at=3
    )
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=2)

    outcome, _ = bisect(sample, tester=tester)

    assert outcome.simpler_culprit == sample.simpler_shas[3]
    ends = {(sample.pypto_shas[0], None), (sample.pypto_shas[-1], sample.simpler_shas[6])}
    assert {(p, s) for _, p, s in tester.rounds[0]} == ends
    halves = [r for r in tester.rounds if any(level == "split" for level, _, _ in r)]
    assert {(p, s) for _, p, s in halves[0]} == {
        (sample.pypto_shas[3], sample.simpler_shas[6]),
        (sample.pypto_shas[4], sample.simpler_shas[1]),
    }
    # the last good pair ran in the last round: that run is the drift check, nothing is re-run
    assert (sample.pypto_shas[4], sample.simpler_shas[2]) in {
        (p, s) for _, p, s in tester.rounds[-1]
    }
    assert not any(level == "drift" for r in tester.rounds for level, _, _ in r)
    fixed = RoundTester(sample, parallel=2)
    bisect(sample, tester=fixed, repeat=1)
    drift = [r for r in fixed.rounds if any(level == "drift" for level, _, _ in r)]
    assert len(drift) == 1 and all(level == "drift" for level, _, _ in drift[0])


def test_on_one_device_the_endpoints_are_checked_one_after_the_other(sample_factory):
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), pypto_regression_at=6))
    tester = RoundTester(sample, parallel=1, false_fail=1.0)  # the good end fails every time

    with pytest.raises(EndpointFailure):
        bisect(sample, tester=tester)

    assert all(len(r) == 1 for r in tester.rounds)
    assert {p for r in tester.rounds for _, p, _ in r} == {sample.pypto_shas[0]}
    assert len(tester.rounds) == 5  # endpoint_check's tries, and the bad end never ran


@pytest.mark.parametrize(
    "spec",
    [
        SampleSpec(
            **SMALL, bumps=((4, 7),), simpler_regression_at=5, broken_simpler=frozenset({3})
        ),
        SampleSpec(
            **{**SMALL, "pypto_commits": 9},
            bumps=((4, 3), (5, 5), (6, 7)),
            broken_simpler=frozenset({3}),
            simpler_regression_at=4,
        ),
    ],
    ids=["broken-state-in-a-bump", "broken-pointer-between-bumps"],
)
def test_on_two_devices_an_untestable_candidate_is_not_tried_again(sample_factory, spec):
    sample = sample_factory(spec)
    tester = RoundTester(sample, parallel=2)

    bisect(sample, tester=tester)

    untestable = [t for t in tester.tested if tester.truth(*t[1:]).value == "skip"]
    # One try of the broken simpler commit, whichever pypto commit pinned or carried it.
    assert len(untestable) == 1, untestable


def test_a_replay_names_the_whole_round_the_devices_would_run_next(sample_factory):
    """What `status` says comes next after an interrupted run on two devices: both picks of
    the round the resumed run takes, not one plain bisection step."""
    from runner.replay import LedgerOnly
    from runner.session import Pending

    sample = sample_factory(
        SampleSpec(**{**SMALL, "pypto_commits": 26}, bumps=((4, 4),), pypto_regression_at=17)
    )
    _, full = bisect(sample, tester=RoundTester(sample, parallel=2))
    kept = full.attempts[: sum(len(r) for r in full.rounds[:2])]  # stopped after two rounds
    replay = session_over(
        sample,
        LedgerOnly(parallel=2),
        lambda p, s: [a for a in kept if (a.pypto_sha, a.simpler_sha) == (p, s)],
    )

    pending = replay.run().pending

    assert isinstance(pending, Pending)
    named = {(pending.pypto, pending.simpler), *pending.also}
    assert named == {(p, s) for _, p, s in full.rounds[2]} and len(named) == 2
    assert str(pending).startswith("pypto tests of ")


def test_a_fresh_session_says_it_reused_nothing_though_it_ran_drift_checks(sample_factory):
    """A very flaky example makes the session re-run the known-good commit mid-search, at times
    in its last rounds: those runs are this session's own, not verdicts taken from the ledger
    (it said "1 drift check verdict reused from the ledger")."""
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), pypto_regression_at=6))
    drift_runs = 0
    for seed in range(12):
        tester = RoundTester(sample, parallel=2, false_fail=0.35, false_pass=0.2, seed=seed)
        events = Notes()
        bisect(sample, tester=tester, events=events)
        drift_runs += sum(level == "drift" for level, _, _ in tester.tested)
        assert not [note for note in events.notes if "reused" in note], (seed, events.notes)
    assert drift_runs


class PipeTester(RoundTester):
    """A tester whose tests take time (a clock, not a wait): each lasts `duration(pypto,
    simpler)` and ends in that order, and the session may start tests while others run
    (`more`), as the Docker tester lets it. `wall`: when the last test ended."""

    adds_requests = True

    def __init__(self, sample: Sample, parallel: int, pipelined: bool = True, **kw) -> None:
        super().__init__(sample, parallel, **kw)
        self.pipelined = pipelined
        self.wall = 0.0
        self.peak = 0

    def duration(self, pypto: str, simpler: str | None) -> float:
        """1 to 3 time units, fixed per pair: the wheels of some pairs take longer to build."""
        return 1.0 + int(pypto[:4], 16) % 3 + (int(simpler[:4], 16) % 2 if simpler else 0)

    def test_round(self, requests, done=None, more=None):
        requests = list(requests)
        self.rounds.append([(r.level, r.pypto, r.simpler) for r in requests])
        running: list[tuple[float, int]] = []
        results: dict[int, Attempt] = {}

        def launch(index: int) -> None:
            request = requests[index]
            heapq.heappush(
                running, (self.wall + self.duration(request.pypto, request.simpler), index)
            )
            self.peak = max(self.peak, len(running))

        for index in range(len(requests)):
            launch(index)
        while running:
            self.wall, index = heapq.heappop(running)
            request = requests[index]
            results[index] = self.test(request.level, request.pypto, request.simpler)
            if done is not None:
                done(results[index])
            if more is None or not self.pipelined:
                continue
            added, joins = more(results[index], index, sorted(i for _, i in running))
            if added and not joins:
                self.rounds.append([])
            for request in added:
                requests.append(request)
                self.rounds[-1].append((request.level, request.pypto, request.simpler))
                launch(len(requests) - 1)
        return [results[i] for i in range(len(requests))]


class TimedRounds(PipeTester):
    """The same clock, one round at a time: a round ends when its slowest test does."""

    adds_requests = False

    def test_round(self, requests, done=None, more=None):
        start = self.wall
        attempts = super().test_round(requests, done, None)
        self.wall = start + max(self.duration(r.pypto, r.simpler) for r in requests)
        return attempts


@pytest.mark.parametrize("k", [2, 3])
def test_devices_that_start_the_next_round_early_run_the_same_tests_in_less_time(sample_factory, k):
    """A deterministic example: a device free before its round ends starts the next round's
    pick when the round's outcome is all but certain. The answer and the tests run are those of
    round after round; only the waiting for a round's slowest test goes."""
    walls = {"rounds": 0.0, "early": 0.0}
    for pypto_at, simpler_at in [(17, None), (6, None), (25, None), (None, 5), (3, None)]:
        spec = SampleSpec(
            **{**SMALL, "pypto_commits": 28, "simpler_commits": 9},
            bumps=((4, 2), (12, 8)),
            pypto_regression_at=pypto_at,
            simpler_regression_at=simpler_at,
        )
        sample = sample_factory(spec)
        rounds = TimedRounds(sample, parallel=k)
        early = PipeTester(sample, parallel=k)
        one, _ = bisect(sample, tester=rounds)
        two, _ = bisect(sample, tester=early)

        assert two.pypto.first_bad == one.pypto.first_bad
        assert two.simpler_culprit == one.simpler_culprit and two.exit_code == one.exit_code == 0
        assert sorted(early.tested) == sorted(rounds.tested)
        assert two.pypto.rounds == one.pypto.rounds
        assert early.peak <= k
        assert early.wall <= rounds.wall
        walls["rounds"] += rounds.wall
        walls["early"] += early.wall
    assert walls["early"] < walls["rounds"], walls


def test_a_flaky_example_whose_early_picks_miss_still_finds_the_culprit_and_replays_the_same(
    sample_factory,
):
    """An early pick the round's real outcome did not call for is one more run, counted like
    any other: the answer stays right, and a replay of the ledger (a resumed run) reaches the
    same answer without a test."""
    from runner.replay import LedgerOnly

    sample = sample_factory(
        SampleSpec(**{**SMALL, "pypto_commits": 20}, bumps=((4, 7),), simpler_regression_at=4)
    )
    right = extra = 0
    for seed in range(12):
        rounds = TimedRounds(sample, parallel=2, false_fail=0.1, false_pass=0.1, seed=seed)
        tester = PipeTester(sample, parallel=2, false_fail=0.1, false_pass=0.1, seed=seed)
        outcome, _ = bisect(sample, tester=tester)
        bisect(sample, tester=rounds)
        extra += len(tester.tested) - len(rounds.tested)
        right += named_both_at_4(outcome, sample)
        replayed = session_over(sample, LedgerOnly(parallel=2), tester.lookup).run()
        assert replayed.pending is None
        assert (replayed.pypto.first_bad, replayed.simpler_culprit, replayed.exit_code) == (
            outcome.pypto.first_bad,
            outcome.simpler_culprit,
            outcome.exit_code,
        )
    assert right >= 11
    assert abs(extra) <= 12  # the lies drawn differ; early starts add little on average


def test_a_tester_that_never_asks_for_more_still_gets_every_run_counted(sample_factory):
    """A call of `test_round` that ran its tests without asking `more` about them: the session
    counts the attempts it returns and decides again, round after round, as without early
    starts (it tested the same round for ever)."""
    sample = sample_factory(SampleSpec(**{**SMALL, "pypto_commits": 20}, pypto_regression_at=13))
    quiet = PipeTester(sample, parallel=2, pipelined=False)
    rounds = TimedRounds(sample, parallel=2)

    outcome, _ = bisect(sample, tester=quiet)
    expected, _ = bisect(sample, tester=rounds)

    assert outcome.pypto.first_bad == expected.pypto.first_bad == sample.pypto_shas[13]
    assert sorted(quiet.tested) == sorted(rounds.tested)
