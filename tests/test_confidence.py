"""The noisy-test engine against brute force, on random histories with random flake rates.

The oracle computes every hypothesis' likelihood the slow way (the chain rule over the runs in
the order they happened, updating the mixture weights one run at a time) and the expected entropy
by building both possible next posteriors; the engine does both with closed forms and prefix sums.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.confidence import (
    RATE_GRID,
    REPLICATE,
    Descend,
    FlakePrior,
    LowConfidence,
    _Model,
    belief,
    decide,
    default_budget,
    endpoint_check,
    evidence,
    pair_verdict,
    tally,
)
from runner.search import Found, Inconclusive, Test, Verdict

G, B, S = Verdict.GOOD, Verdict.BAD, Verdict.SKIP


def brute_posterior(count: int, runs: list[tuple[int, Verdict]], prior: FlakePrior) -> list[float]:
    """P(first bad = h) for h in 1..count-1 under a uniform prior, from brute_likelihood."""
    weights = [brute_likelihood(h, runs, prior) for h in range(1, count)]
    total = sum(weights)
    return [w / total for w in weights]


def entropy(ps: list[float]) -> float:
    return -sum(p * math.log2(p) for p in ps if p > 0)


def brute_gain(count: int, runs: list[tuple[int, Verdict]], index: int, prior: FlakePrior) -> float:
    """Expected entropy drop of one more run at ``index``, from the unnormalised chain rule."""
    now = brute_posterior(count, runs, prior)
    z_now = _evidence(count, runs, prior)
    after = 0.0
    for outcome in (G, B):
        grown = [*runs, (index, outcome)]
        p_outcome = _evidence(count, grown, prior) / z_now
        after += p_outcome * entropy(brute_posterior(count, grown, prior))
    return entropy(now) - after


def _evidence(count: int, runs: list[tuple[int, Verdict]], prior: FlakePrior) -> float:
    """P(runs) under a uniform prior on h: the normaliser of brute_posterior, recomputed."""
    total = 0.0
    for h in range(1, count):
        single = brute_likelihood(h, runs, prior)
        total += single / (count - 1)
    return total


def brute_likelihood(h: int, runs: list[tuple[int, Verdict]], prior: FlakePrior) -> float:
    """P(runs | first bad = h) by the chain rule over the runs in order.

    The rarely/often-flaky switch is shared by both sides, each side has its own Beta rate within
    it; every run's predictive probability updates the switch's weights and the side's counts.
    """
    comps = [
        {"w": 1 - prior.high_weight, "ab": prior.low, "good": [0, 0], "bad": [0, 0]},
        {"w": prior.high_weight, "ab": prior.high, "good": [0, 0], "bad": [0, 0]},
    ]
    likelihood = 1.0
    for index, verdict in runs:
        if verdict is S:
            continue
        side = "good" if index < h else "bad"
        error = (verdict is B) if side == "good" else (verdict is G)
        total = sum(c["w"] for c in comps)
        p = 0.0
        for c in comps:
            a, b = c["ab"]
            errors, correct = c[side]
            rate = (a + errors) / (a + b + errors + correct)
            p_c = rate if error else 1 - rate
            p += c["w"] / total * p_c
            c["w"] *= p_c
            c[side][0 if error else 1] += 1
        likelihood *= p
    return likelihood


def as_observations(runs: list[tuple[int, Verdict]]) -> dict[int, list[Verdict]]:
    out: dict[int, list[Verdict]] = {}
    for index, verdict in runs:
        out.setdefault(index, []).append(verdict)
    return out


@st.composite
def noisy_runs(draw: st.DrawFn) -> tuple[int, list[tuple[int, Verdict]]]:
    count = draw(st.integers(2, 12))
    culprit = draw(st.integers(1, count - 1))
    flake = draw(st.floats(0.0, 0.4))
    rng = random.Random(draw(st.integers(0, 2**32)))
    runs = []
    for _ in range(draw(st.integers(0, 25))):
        index = rng.randrange(count)
        truth = B if index >= culprit else G
        verdict = (G if truth is B else B) if rng.random() < flake else truth
        runs.append((index, verdict))
    return count, runs


@settings(max_examples=150, deadline=None)
@given(case=noisy_runs(), shared=st.tuples(*[st.integers(0, 5)] * 4))
def test_the_posterior_and_flake_rates_match_the_chain_rule_oracle(case, shared):
    count, runs = case
    prior = FlakePrior(evidence=shared)
    # evidence from elsewhere = runs that happened before, on both sides of every hypothesis
    oracle = brute_posterior(
        count,
        [(-1, B)] * shared[0]
        + [(-1, G)] * shared[1]
        + [(count, G)] * shared[2]
        + [(count, B)] * shared[3]
        + runs,
        prior,
    )
    engine = belief(count, as_observations(runs), prior)

    assert engine.probabilities[0] == 0
    assert engine.probabilities[1:] == pytest.approx(oracle, rel=1e-9, abs=1e-12)
    assert sum(engine.probabilities) == pytest.approx(1)
    assert 0 < engine.false_fail < 1 and 0 < engine.false_pass < 1


@settings(max_examples=100, deadline=None)
@given(case=noisy_runs())
def test_the_expected_information_gain_matches_building_both_outcomes(case):
    count, runs = case
    prior = FlakePrior()
    model = _Model(count, tally(as_observations(runs)), prior)
    gains = model.gains()
    for index in range(count):
        assert gains[index] == pytest.approx(brute_gain(count, runs, index, prior), abs=1e-9)


@st.composite
def noisy_histories(draw: st.DrawFn) -> tuple[int, int, float, float, int]:
    count = draw(st.integers(2, 40))
    culprit = draw(st.integers(1, count - 1))
    false_fail = draw(st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.3]))
    false_pass = draw(st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.3]))
    return count, culprit, false_fail, false_pass, draw(st.integers(0, 2**32))


def drive(
    count: int,
    culprit: int,
    false_fail: float,
    false_pass: float,
    seed: int,
    last_good_runs: int = REPLICATE,
):
    """Verify the endpoints, then follow the engine until it decides; returns (decision, runs)."""
    rng = random.Random(seed)
    observations: dict[int, list[Verdict]] = {}

    def run(index: int) -> None:
        truth = B if index >= culprit else G
        lies = rng.random() < (false_pass if truth is B else false_fail)
        observations.setdefault(index, []).append((G if truth is B else B) if lies else truth)

    for index, expected in ((0, G), (count - 1, B)):
        while (state := endpoint_check(observations.get(index, []), expected)) == "again":
            run(index)
        if state == "failed":
            return None, observations
    for _ in range(default_budget(count) + 1):
        step = decide(count, observations, last_good_runs=last_good_runs)
        if not isinstance(step, Test):
            return step, observations
        for index in step.indices:  # a settled boundary may ask for all its runs at once
            assert 0 <= index < count
            run(index)
    raise AssertionError("the engine ran past its own budget")


@settings(max_examples=150, deadline=None)
@given(case=noisy_histories())
def test_every_noisy_search_ends_and_a_found_culprit_is_the_oracles_confident_answer(case):
    count, culprit, false_fail, false_pass, seed = case
    decision, observations = drive(count, culprit, false_fail, false_pass, seed)
    if decision is None:
        return  # an endpoint lied every time it ran: the session stops there
    runs = sum(len(v) for v in observations.values())
    assert runs <= default_budget(count) + 2 * 5
    assert isinstance(decision, Found | LowConfidence)
    if isinstance(decision, Found):
        flat = [(i, v) for i, seen in observations.items() for v in seen]
        oracle = brute_posterior(count, flat, FlakePrior())
        assert oracle[decision.index - 1] >= 0.95
        assert decision.index - 1 == max(range(len(oracle)), key=oracle.__getitem__)
    if false_fail == false_pass == 0:
        assert decision == Found(culprit)
        plain = 2 + math.ceil(math.log2(count - 1)) if count > 2 else 2
        assert runs <= plain + 3, "a deterministic example costs at most 3 tests more"


def known_rate_posterior(
    count: int, observations: dict[int, list[Verdict]], false_fail: float, false_pass: float
) -> tuple[list[float], float]:
    """P(first bad = h) for h in 1..count-1 with the flake rates known, run by run, and the
    probability of the runs (uniform prior on h)."""
    likelihoods = []
    for h in range(1, count):
        likelihood = 1.0
        for index, seen in observations.items():
            for verdict in seen:
                if index < h:
                    likelihood *= false_fail if verdict is B else 1 - false_fail
                else:
                    likelihood *= false_pass if verdict is G else 1 - false_pass
        likelihoods.append(likelihood)
    total = sum(likelihoods)
    return [x / total for x in likelihoods], total / (count - 1)


@settings(max_examples=150, deadline=None)
@given(case=noisy_histories())
def test_a_culprit_found_in_a_record_that_contradicts_itself_holds_for_every_plausible_rate(case):
    count, culprit, false_fail, false_pass, seed = case
    decision, observations = drive(count, culprit, false_fail, false_pass, seed)
    if not isinstance(decision, Found):
        return
    h = decision.index
    lies = sum(
        (verdict is B) != (index >= h) for index, seen in observations.items() for verdict in seen
    )
    if lies == 0:
        return  # a clean record: the mixture prior and the replication rule decide
    rated = {
        (ff, fp): known_rate_posterior(count, observations, ff, fp)
        for ff in RATE_GRID
        for fp in RATE_GRID
    }
    best = max(total for _, total in rated.values())
    for posterior, total in rated.values():
        if total >= best * (1 - 0.95):
            assert posterior[h - 1] >= 0.95 - 1e-9


def test_a_boundary_that_needs_the_fewest_lies_is_not_trusted_while_other_rates_blame_another():
    # 2 failed six times in ten: a bad commit passing 40 % of the time, or a good one failing
    # 60 % of the time with 3 and 4 good too. The mixture prefers the first (fewer lies); the
    # rates (30 % false fails, 5 % false passes) that make 4 the culprit are not ruled out.
    observations = {
        0: [G],
        1: [G] * 9,
        2: [B, B, G, G, B, G, B, G, B, B],
        3: [G, G, B, B],
        4: [B, B],
        5: [G, B],
    }
    assert belief(6, observations).probabilities[2] > 0.95
    assert isinstance(decide(6, observations), Test)
    posterior, _ = known_rate_posterior(6, observations, 0.3, 0.05)
    assert posterior[2 - 1] < 0.01


@pytest.mark.parametrize("last_good_runs", [2, 3])
@pytest.mark.parametrize(
    ("false_fail", "false_pass", "at_least", "wrong_at_most"),
    # measured (drift check off / on): right 198 / 199 of 200 at 10 % both ways, 195 / 198 at 30 %
    # false passes, 195 / 194 at 30 % false fails; confidently wrong at most 6 of 200
    [(0.1, 0.1, 0.95, 0.05), (0.05, 0.3, 0.95, 0.05), (0.3, 0.05, 0.95, 0.05)],
)
def test_flaky_examples_give_the_right_culprit_for_nearly_every_seed(
    false_fail, false_pass, at_least, wrong_at_most, last_good_runs
):
    rng = random.Random(2026)
    right = wrong_but_confident = 0
    trials = 200
    for seed in range(trials):
        count = rng.randint(6, 16)
        culprit = rng.randint(1, count - 1)
        decision, _ = drive(count, culprit, false_fail, false_pass, seed, last_good_runs)
        right += decision == Found(culprit)
        wrong_but_confident += isinstance(decision, Found) and decision.index != culprit
    assert right >= at_least * trials
    assert wrong_but_confident <= wrong_at_most * trials


def test_untestable_neighbours_of_the_culprit_pool_into_one_inconclusive_block():
    # 0 good, 1 good, 2 and 3 cannot be built, 4 bad, 5 bad
    observations = {0: [G], 1: [G, G], 2: [S], 3: [S], 4: [B, B], 5: [B]}
    decision = decide(6, observations)
    assert decision == Inconclusive(2, 4)


def test_a_fifty_fifty_example_ends_as_low_confidence_with_the_candidates():
    rng = random.Random(7)
    observations: dict[int, list[Verdict]] = {0: [G], 7: [B]}
    for _ in range(default_budget(8) + 5):
        step = decide(8, observations)
        if not isinstance(step, Test):
            break
        observations.setdefault(step.indices[0], []).append(rng.choice([G, B]))
    assert isinstance(step, LowConfidence)
    probabilities = [p for _, p in step.candidates]
    assert probabilities == sorted(probabilities, reverse=True)
    assert probabilities[0] < 0.95


def test_a_deterministic_boundary_is_retested_rather_than_trusted_once():
    observations = {0: [G], 3: [G], 4: [B], 7: [B], 5: [B], 2: [G]}
    step = decide(8, observations)
    assert isinstance(step, Test) and step.indices[0] in (3, 4)


def test_pair_verdicts_repeat_until_sure_and_endpoints_fail_only_on_repeated_contradiction():
    assert pair_verdict([G], false_fail=0.01, false_pass=0.01) is G
    assert pair_verdict([B], false_fail=0.2, false_pass=0.2) is None
    assert pair_verdict([B, B, B], false_fail=0.2, false_pass=0.2) is B
    assert pair_verdict([S], false_fail=0.2, false_pass=0.2) is S
    assert endpoint_check([B], G) == "again"
    assert endpoint_check([B, G], G) == "confirmed"
    assert endpoint_check([B] * 5, G) == "failed"
    assert endpoint_check([S], G) == "failed"


def test_evidence_counts_errors_on_each_side_of_the_culprit():
    assert evidence({0: [G, B], 2: [B, G], 1: [G]}, first_bad=2) == (1, 2, 1, 1)


@pytest.mark.parametrize("last_good_runs", [2, 3])
def test_every_deterministic_history_costs_at_most_three_tests_more_than_plain_bisection(
    last_good_runs,
):
    """Plain bisection here is the endpoints and ceil(log2) steps. The session's drift check
    (``last_good_runs=3``) costs nothing on top: the boundary shows five runs either way, two
    fails and three passes or three fails and two passes, the last of them the drift check."""
    worst = 0
    for count in range(3, 49):
        for culprit in range(1, count):
            decision, observations = drive(count, culprit, 0.0, 0.0, 0, last_good_runs)
            assert decision == Found(culprit)
            runs = sum(len(v) for v in observations.values())
            worst = max(worst, runs - (2 + math.ceil(math.log2(count - 1))))
    assert worst <= 3


@pytest.mark.parametrize("inside_weight", [1 / 4, 1 / 8])
def test_probability_outside_a_consistent_range_does_not_make_its_split_uneven(inside_weight):
    """A second level starts like this: the hypotheses before its range (the first level's
    commits, which need its last pass to be a lie) keep much of the probability, and the most
    informative pick leans towards them: 23 of 11..41 at weight 1/8, which leaves 18 candidates
    on a pass and costs a deterministic example a sixth step. Picks of new commits inside the
    range keep plain bisection's worst case, ceil(log2 31) = 5."""
    count, last_good = 42, 10
    weights = [1.0] * (last_good + 1) + [inside_weight] * (count - last_good - 1)
    worst = 0
    for culprit in range(last_good + 1, count):
        observations = {0: [G], last_good: [G], count - 1: [B]}
        new_inside = 0
        while isinstance(step := decide(count, observations, weights=weights), Test):
            index = step.indices[0]
            if index in observations:
                break  # the range is settled: the boundary's re-tests
            new_inside += last_good < index < count - 1
            observations[index] = [B if index >= culprit else G]
        worst = max(worst, new_inside)
    assert worst == math.ceil(math.log2(count - 1 - last_good))


def test_a_boundary_takes_its_fifth_run_on_the_side_the_model_doubts():
    # The bad side has two runs (16 and the end), so after two fails and two passes the model
    # still doubts 16 and asks for a third fail. That run is the fifth of the boundary: the last
    # good commit, whose second pass is among the last runs and so serves as the drift check,
    # needs no third pass on top. Where the bad side is settled, the fifth run is that pass.
    observations = {0: [G], 8: [G], 12: [G], 14: [G], 15: [G, G], 16: [B, B], 32: [B]}
    assert belief(33, observations).probabilities[16] < 0.95
    assert decide(33, observations, last_good_runs=3) == Test((16,))
    assert decide(33, {**observations, 16: [B, B, B]}, last_good_runs=3) == Found(16)
    assert decide(8, {0: [G], 2: [G], 3: [G, G], 4: [B, B], 5: [B], 7: [B]}, last_good_runs=3) == (
        Test((3,))
    )


def test_what_plain_bisection_leaves_unused_buys_the_boundary_a_run_more_on_each_side():
    # 9 candidates: plain bisection takes 4 steps at worst; this search took 3.
    decision, observations = drive(10, 3, 0.0, 0.0, 0, last_good_runs=3)
    assert decision == Found(3)
    assert observations[3] == [B] * 3 and observations[2] == [G] * 3
    assert sum(map(len, observations.values())) == 2 + 4 + 3
    # A level whose allowance was spent before it (plain=0) reports at two fails, three passes.
    settled = {0: [G], 9: [B], 5: [B], 2: [G, G, G], 3: [B, B]}
    assert decide(10, settled, last_good_runs=3) == Test((3,))
    assert decide(10, settled, last_good_runs=3, plain=0) == Found(3)


@settings(max_examples=60, deadline=None)
@given(case=noisy_runs(), data=st.data())
def test_prior_weights_scale_each_hypothesis_and_nothing_else(case, data):
    count, runs = case
    drawn = data.draw(st.lists(st.floats(0.05, 20), min_size=count - 1, max_size=count - 1))
    weights = [1.0, *drawn]
    plain = belief(count, as_observations(runs)).probabilities
    weighted = belief(count, as_observations(runs), weights=weights).probabilities
    scaled = [p * w for p, w in zip(plain, weights, strict=True)]
    assert weighted[1:] == pytest.approx([s / sum(scaled) for s in scaled[1:]], rel=1e-9, abs=1e-12)


def test_a_pointer_move_is_handed_to_the_second_level_once_only_its_boundary_is_left():
    # 0 good .. 4 good, 5 bad .. 9 bad: 5 moves the pointer
    observations = {0: [G], 9: [B], 4: [G], 7: [B], 5: [B], 2: [G]}
    assert decide(10, observations) in (Test((4,)), Test((5,)))  # a plain commit: re-test it
    assert decide(10, observations, descend={5}) == Descend(5)
    assert decide(10, {0: [G], 9: [B], 4: [G]}, descend={5}) != Descend(5)  # not settled yet


def test_the_last_good_commit_passes_once_more_when_its_last_run_is_also_the_drift_check():
    observations = {0: [G], 2: [G], 3: [G, G], 4: [B, B], 5: [B], 7: [B]}
    assert decide(8, observations) == Found(4)
    assert decide(8, observations, last_good_runs=3) == Test((3,))
    # Every run the boundary still needs, so several devices can run them in one round.
    settled = {0: [G], 1: [G], 2: [G, G], 3: [G], 4: [B, B], 5: [B, B], 6: [B], 7: [B]}
    assert decide(8, settled, last_good_runs=3) == Test((3, 3))
    assert decide(8, {**observations, 3: [G, G, G]}, last_good_runs=3) == Found(4)


def test_a_low_confidence_answer_above_the_threshold_says_why_it_is_not_trusted():
    """The runs disagree: the likeliest holds 99 % under the rates they point to, but not under
    rates they have not ruled out, and the budget is spent. Saying "no commit reached 95 %; the
    likeliest are X (99 %)" and nothing more contradicts itself."""
    from runner.confidence import why_low
    from runner.session import LevelResult, _low_confidence_note

    observations = {0: [G, G, B], 1: [G] * 6, 2: [B] * 6 + [G], 3: [B, B]}
    decision = decide(4, observations, budget=15)

    assert isinstance(decision, LowConfidence)
    (index, top), *_ = decision.candidates
    assert index == 2 and top >= 0.95
    result = LevelResult("pypto", ["a" * 40, "b" * 40, "c" * 40, "d" * 40], tests=15)
    result.low_confidence = decision.candidates
    note = _low_confidence_note(result, 0.95)
    assert note.endswith(why_low(top, 0.95)) and "have not ruled out" in note
    assert why_low(0.7, 0.95) == ""
