"""The noisy-test bisect engine: a posterior over the first bad commit, and what to test next.

A precision example is a noisy test: a golden comparison on hardware fails now and then on a good
commit and passes now and then on a bad one. Trusting one run per commit names a wrong culprit with
exit code 0. So every attempt is kept, and the search works on the probability of each candidate
being the first bad one given all of them.

The model (the same family as git_bayesect's): a commit before the first bad one fails with an
unknown rate ``false_fail``, a commit at or after it passes with an unknown rate ``false_pass``.
Both rates get a Beta prior (a little flakiness is expected, none is also fine) and are integrated
out analytically, so contradictions seen anywhere in the session, including repeated runs of the
endpoints, raise the estimated rates and make the search re-test rather than trust a lone verdict.
The posterior depends only on how many passes and fails each index has, not on their order: a
resumed session that loads the same attempts is in exactly the state the interrupted one was.

The next test is the index (re-tests and endpoints included) whose outcome is expected to shrink
the posterior's entropy most. With a deterministic example that is the plain bisection midpoint
until one candidate is left, then a re-test or two of the boundary to reach the confidence.

A culprit is reported only once both sides of its boundary reproduced: the last good and the first
bad commit (endpoints aside) each showed their verdict ``REPLICATE`` times. One lie that steered
the search leaves a record that is consistent with the wrong boundary and with nothing else: the
lie sits at that boundary, and only running it again can expose it. The posterior cannot see this
on its own, because what it believes about the flake rates comes from the very runs the lie
left consistent. A session that checks for drift at the end asks the boundary for one run more,
on the side the model doubts (the last good commit unless the first bad one needs it more), and
takes the last good commit's last pass as its drift check. Runs plain bisection's worst case
would have spent and the search did not (`ALLOWANCE` over it) buy each side a run more. A record
that contradicts itself must also hold under every flake rate it has not ruled out
(`_worst_rates`).

Untestable commits (a skip) are never offered again. Candidates that only untestable commits
separate cannot be told apart by any test, so they are pooled into one block; a block that reaches
the confidence is the old engine's ``Inconclusive`` range.

Pure like `runner.search`: no git, no Docker, no clock, no printing, so hypothesis can check it
against a brute-force enumeration and replay can rerun it from the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from runner.search import Found, Inconclusive, Test, Verdict

DEFAULT_CONFIDENCE = 0.95
ENDPOINT_TRIES = 5
PAIR_TRIES = 6
REPLICATE = 2
"""How many times each side of a reported boundary must have shown its verdict."""
ALLOWANCE = 3
"""Runs over plain bisection's worst case (the endpoints and ceil(log2) steps) a deterministic
example may cost; what the search leaves of it buys each side of the boundary a run more."""


@dataclass(frozen=True)
class FlakePrior:
    """The prior of each error rate: a mixture of "rarely flaky" and "often flaky" Betas.

    One Beta centred on a few percent is too sure: an example that lies 30 % of the time looks
    deterministic for a while and the search stops on a wrong culprit. A single wide Beta costs a
    deterministic example many re-tests. The mixture keeps both cheap: consistent runs quickly
    favour the first component, contradictions the second. Pseudo-counts are (errors, correct).
    Each side learns its own rate within the shared switch, so an example that lies one way only
    is not trusted the other way. tests/bench/bench_confidence.py measures the trade-off.
    """

    low: tuple[float, float] = (0.5, 12.0)
    high: tuple[float, float] = (1.5, 3.5)
    high_weight: float = 0.4
    # Runs judged elsewhere in the session (the level above): false fails, true passes, false
    # passes, true fails. The example's flakiness does not change between levels.
    evidence: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        if min(*self.low, *self.high) <= 0 or not 0 <= self.high_weight < 1:
            raise ValueError("flake prior pseudo-counts must be positive, the weight in [0, 1)")
        if min(self.evidence) < 0:
            raise ValueError("evidence counts cannot be negative")


def evidence(
    observations: Mapping[int, Sequence[Verdict | str]], first_bad: int
) -> tuple[int, int, int, int]:
    """What a finished level says about the flake rates, taking ``first_bad`` as the truth."""
    counts = [0, 0, 0, 0]
    for i, t in tally(observations).items():
        if i < first_bad:
            counts[0] += t.bad
            counts[1] += t.good
        else:
            counts[2] += t.good
            counts[3] += t.bad
    return counts[0], counts[1], counts[2], counts[3]


@dataclass(frozen=True)
class Tally:
    """What one index has shown so far."""

    good: int = 0
    bad: int = 0
    skip: int = 0

    @property
    def runs(self) -> int:
        return self.good + self.bad + self.skip


@dataclass(frozen=True)
class LowConfidence:
    """No candidate reached the confidence and no further test is allowed or informative.

    ``candidates`` are (index, probability), most likely first, down to 99 % of the mass.
    """

    candidates: tuple[tuple[int, float], ...]


def why_low(top: float, confidence: float) -> str:
    """Why a candidate above the confidence still left the level inconclusive (`_worst_rates`),
    as a clause to add to what names the candidates; empty when none was above it."""
    if top < confidence:
        return ""
    return (
        f" (the likeliest is above {confidence:.0%} under the flake rates the runs point to, but "
        "they disagree among themselves, and under rates they have not ruled out it falls below; "
        "no test within the budget would settle it)"
    )


@dataclass(frozen=True)
class Descend:
    """The likeliest first bad commit moves the submodule pointer and only its boundary is left
    to check: a second level refines this hypothesis, and checks the boundary with all the runs
    of both levels (see `runner.session`), so this level stops without replicating it."""

    index: int


Decision = Test | Found | Inconclusive | LowConfidence | Descend


@dataclass(frozen=True)
class Belief:
    """The posterior of one level.

    ``probabilities[i]`` is P(first bad commit is index i); index 0 (the known-good end) is 0.
    ``blocks`` are the candidate groups no test can separate, as (first, last, probability).
    ``consistent``: every run the rates were learnt from agrees with one boundary (passes only
    before fails), so the rates are the prior's guess, not a measurement.
    """

    count: int
    probabilities: tuple[float, ...]
    false_fail: float
    false_pass: float
    blocks: tuple[tuple[int, int, float], ...]
    tallies: Mapping[int, Tally]
    consistent: bool = True

    def ranked(self, mass: float = 0.99, limit: int = 10) -> tuple[tuple[int, float], ...]:
        """The likeliest candidates, most likely first, until ``mass`` is covered."""
        order = sorted(range(1, self.count), key=lambda i: (-self.probabilities[i], i))
        out: list[tuple[int, float]] = []
        covered = 0.0
        for i in order:
            if covered >= mass or len(out) >= limit:
                break
            out.append((i, self.probabilities[i]))
            covered += self.probabilities[i]
        return tuple(out)

    @property
    def top_block(self) -> tuple[int, int, float]:
        return max(self.blocks, key=lambda b: (b[2], -b[0]))

    @property
    def entropy(self) -> float:
        return -sum(p * math.log2(p) for p in self.probabilities if p > 0)


def tally(observations: Mapping[int, Sequence[Verdict | str]]) -> dict[int, Tally]:
    out: dict[int, Tally] = {}
    for i, seen in observations.items():
        verdicts = [Verdict(v) for v in seen]
        out[i] = Tally(
            good=verdicts.count(Verdict.GOOD),
            bad=verdicts.count(Verdict.BAD),
            skip=verdicts.count(Verdict.SKIP),
        )
    return out


def belief(
    count: int,
    observations: Mapping[int, Sequence[Verdict | str]],
    prior: FlakePrior | None = None,
    weights: Sequence[float] | None = None,
) -> Belief:
    """The posterior over the first bad index ``1..count-1`` given every recorded verdict.

    ``weights[h]`` is hypothesis h's prior weight (uniform when None; index 0 unused)."""
    prior = prior or FlakePrior()
    tallies = _checked(count, observations)
    model = _Model(count, tallies, prior, weights)
    probs = model.posterior
    return Belief(
        count=count,
        probabilities=tuple([0.0, *probs]),
        false_fail=sum(p * r for p, r in zip(probs, model.fail_if_good, strict=True)),
        false_pass=sum(p * (1 - r) for p, r in zip(probs, model.fail_if_bad, strict=True)),
        blocks=_blocks(count, tallies, probs),
        tallies=tallies,
        consistent=consistent(tallies),
    )


def consistent(tallies: Mapping[int, Tally]) -> bool:
    """Whether every run agrees with one boundary: passes only before fails."""
    goods = [i for i, t in tallies.items() if t.good]
    bads = [i for i, t in tallies.items() if t.bad]
    return not goods or not bads or max(goods) < min(bads)


def bisection_steps(count: int) -> int:
    """Steps plain bisection takes at worst to find the first bad of ``count`` candidates whose
    ends are known (the endpoints not counted): ceil(log2(count - 1))."""
    return math.ceil(math.log2(max(count - 1, 1)))


def default_budget(count: int) -> int:
    """How many attempts one level may take before it gives up as low confidence.

    Generous (several times a plain bisection) because a 30 % flaky example needs that many, and
    a session that gives up has no answer at all; a deterministic one stops long before.
    """
    return 20 * max(1, math.ceil(math.log2(max(count, 2)))) + 60


def decide(
    count: int,
    observations: Mapping[int, Sequence[Verdict | str]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    budget: int | None = None,
    prior: FlakePrior | None = None,
    retest_endpoints: bool = True,
    weights: Sequence[float] | None = None,
    descend: Collection[int] = (),
    last_good_runs: int = REPLICATE,
    plain: int | None = None,
) -> Decision:
    """Found / Inconclusive when one block of candidates reaches ``confidence`` and its boundary
    reproduced; else what to test.

    Indices 0 and ``count-1`` are the verified endpoints: the model takes them as good and bad,
    and their runs only teach it the flake rates; ``retest_endpoints=False`` never offers them
    (the user said to assume them). ``budget`` caps the attempts of the level. ``weights`` are
    the hypotheses' prior weights. A hypothesis in ``descend`` is refined by a second level: once
    it is the likeliest block and nothing but its boundary is left to test (or it reached the
    confidence), the answer is `Descend`, and the second level checks that boundary with every
    run of both levels. ``last_good_runs`` is how many passes the last good commit needs: the
    session asks one more than `REPLICATE` when that last run also serves as its drift check,
    and a third fail of the first bad commit, asked for by the model, stands in for that pass.
    ``plain`` is what plain bisection would spend at worst on this level's runs (see
    `_unreplicated`; None: the endpoints and ceil(log2) steps of this level).
    """
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be between 0.5 and 1, got {confidence}")
    prior = prior or FlakePrior()
    tallies = _checked(count, observations)
    model = _Model(count, tallies, prior, weights)
    blocks = _blocks(count, tallies, model.posterior)
    first, last, mass = max(blocks, key=lambda b: (b[2], -b[0]))
    if (
        first == last
        and first in descend
        and mass >= 0.5
        and (mass >= confidence or model.best_test(retest_endpoints) in (first - 1, first))
    ):
        return Descend(first)
    runs = sum(t.runs for t in tallies.values())
    if budget is None:
        budget = default_budget(count)
    doubt = model
    if mass >= confidence:
        worst = _worst_rates(model, first, last, confidence)
        if worst is None:
            needed = _unreplicated(count, tallies, first, last, last_good_runs, plain)
            if needed:
                return Test(tuple(needed))
            return Found(first) if first == last else Inconclusive(first, last)
        doubt = worst
    pick = None if runs >= budget else doubt.best_test(retest_endpoints)
    if pick is None:
        probs = (0.0, *model.posterior)
        order = sorted(range(1, count), key=lambda i: (-probs[i], i))
        ranked: list[tuple[int, float]] = []
        covered = 0.0
        for i in order:
            if covered >= 0.99 or len(ranked) >= 10:
                break
            ranked.append((i, probs[i]))
            covered += probs[i]
        return LowConfidence(tuple(ranked))
    return Test((pick,))


RATE_GRID = (0.005, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45)
"""The flake rates (each side) the robust check tries once a record contradicts itself."""


def _worst_rates(model: _Model, first: int, last: int, confidence: float) -> _Model | None:
    """The model with fixed flake rates under which the block is least likely, when that is
    below the confidence for rates the record has not ruled out; None when the block holds.

    The mixture prior is what keeps a deterministic example cheap, and it is also what makes
    the posterior overconfident on a flaky one: the hypothesis that needs the fewest lies wins,
    because the rates are learnt from the same runs, and a record with a lie at the boundary
    looks cleaner with the wrong boundary. Once the record contradicts itself (some run
    disagrees with the likeliest boundary, or the level above saw a lie), the example is known
    to be flaky and the block must reach the confidence under every pair of fixed rates (false
    fail, false pass) whose likelihood is within a factor 1 / (1 - confidence) of the best
    pair's: those are the rates the record has not ruled out. The next test is then the one
    that would tell most under the worst of them. A record without contradictions is left to
    the mixture prior: it cannot tell a deterministic example from a lucky flaky one, and
    `REPLICATE` guards its boundary.
    """
    top = max(range(len(model.posterior)), key=model.posterior.__getitem__)
    if model.errors[top] == 0:
        return None
    worst: tuple[float, float, float] | None = None
    plausible: list[tuple[float, float, float, list[float]]] = []
    best = -math.inf
    for ff in RATE_GRID:
        for fp in RATE_GRID:
            logs = model.fixed_log_likelihoods(ff, fp)
            peak = max(logs)
            total = peak + math.log(sum(math.exp(v - peak) for v in logs))
            best = max(best, total)
            plausible.append((ff, fp, total, logs))
    cut = best + math.log(1 - confidence)
    for ff, fp, total, logs in plausible:
        if total < cut:
            continue
        p = sum(math.exp(logs[h - 1] - total) for h in range(first, last + 1))
        if worst is None or p < worst[0]:
            worst = (p, ff, fp)
    assert worst is not None
    if worst[0] >= confidence:
        return None
    return model.with_rates(worst[1], worst[2])


def boundary_runs(
    posterior: Belief, last_good_runs: int = REPLICATE, plain: int | None = None
) -> list[int]:
    """The runs the likeliest boundary still needs before it can be reported (see `decide`)."""
    first, last, _mass = posterior.top_block
    return _unreplicated(posterior.count, posterior.tallies, first, last, last_good_runs, plain)


def _unreplicated(
    count: int,
    tallies: Mapping[int, Tally],
    first: int,
    last: int,
    good_times: int,
    plain: int | None = None,
) -> list[int]:
    """The runs the boundary of a block still needs, one entry per run: the first bad commit
    (``last``) and the last good one (``first - 1``) each show their verdict `REPLICATE` times,
    and together ``REPLICATE + good_times`` times, endpoints excepted (every hypothesis takes
    those as good and bad, and they were verified on their own). A run beyond `REPLICATE` on
    either side counts, so where the model asked the first bad commit for a third fail the last
    good one needs no third pass: on a deterministic example the boundary costs five runs either
    way. Otherwise the extra run is the last good commit's. Runs that ``plain`` (plain
    bisection's worst case for the level's record) and `ALLOWANCE` leave unused buy each side a
    run more than `REPLICATE`, the first bad commit first. The first bad commit's runs come
    first and the last good one's last, so a session can take that last run as the proof that
    good commits still pass at the end; a round with several devices runs them all at once."""
    sides: list[tuple[int, int]] = []  # (index, runs with its verdict)
    for index, verdict in ((last, "bad"), (first - 1, "good")):
        if not 0 < index < count - 1:
            continue
        t = tallies.get(index, Tally())
        if t.skip:
            continue
        sides.append((index, t.bad if verdict == "bad" else t.good))
    want = {index: max(shown, REPLICATE) for index, shown in sides}
    good_side = first - 1 in want  # else the last good commit is the known-good end
    if good_side:
        total = REPLICATE + good_times if len(sides) == 2 else good_times
        want[first - 1] += max(0, total - sum(want.values()))
    # What plain bisection's worst case and the allowance leave after these runs buys each side
    # (the first bad commit first) up to one run more than `REPLICATE`.
    if plain is None:
        plain = 2 + bisection_steps(count)
    runs = sum(t.runs for t in tallies.values())
    left = plain + ALLOWANCE - runs - sum(want[index] - shown for index, shown in sides)
    if good_times > REPLICATE and not good_side:
        left -= 1  # the drift check re-runs the known-good end: the last good commit is that end
    for index, _shown in sides:
        more = max(0, min(REPLICATE + 1 - want[index], left))
        want[index] += more
        left -= more
    return [index for index, shown in sides for _ in range(want[index] - shown)]


def pair_verdict(
    seen: Sequence[Verdict | str],
    *,
    false_fail: float,
    false_pass: float,
    confidence: float = DEFAULT_CONFIDENCE,
    tries: int = PAIR_TRIES,
    prior_bad: float = 0.5,
    seen_elsewhere: tuple[int, int, int, int] | None = None,
) -> Verdict | None:
    """Judge one (pypto, simpler) pair from repeated runs, or None: run it again.

    Used for the code/pointer halves of a bump (even odds) and for re-checking commits expected
    to pass (``prior_bad`` low: a known-good commit turning bad takes more than one failure),
    with the flake rates the first level estimated. Given the runs the bisect judged
    (``seen_elsewhere``, as counted by `evidence`), the rates are integrated out instead of taken
    as point estimates: each contradiction among ``seen`` also raises the rate that would explain
    it, so a few unlucky runs of a flaky example do not look like a change.
    A skip decides at once (the pair cannot be built or run). After ``tries`` runs the likelier
    verdict is returned even below the confidence.
    """
    verdicts = [Verdict(v) for v in seen]
    if Verdict.SKIP in verdicts:
        return Verdict.SKIP
    if not verdicts:
        return None
    if seen_elsewhere is None:
        p_bad = pair_probability_bad(
            verdicts, false_fail=false_fail, false_pass=false_pass, prior_bad=prior_bad
        )
    else:
        p_bad = _pair_marginal(verdicts, seen_elsewhere, prior_bad, FlakePrior())
    if p_bad >= confidence:
        return Verdict.BAD
    if 1 - p_bad >= confidence:
        return Verdict.GOOD
    if len(verdicts) >= tries:
        return Verdict.BAD if p_bad >= 0.5 else Verdict.GOOD
    return None


def pair_probability_bad(
    seen: Sequence[Verdict | str], *, false_fail: float, false_pass: float, prior_bad: float = 0.5
) -> float:
    """P(the pair is truly bad | its runs) with the given error rates and prior."""
    ff = min(max(false_fail, 1e-6), 0.5)
    fp = min(max(false_pass, 1e-6), 0.5)
    verdicts = [Verdict(v) for v in seen]
    fails, passes = verdicts.count(Verdict.BAD), verdicts.count(Verdict.GOOD)
    log_bad = fails * math.log(1 - fp) + passes * math.log(fp)
    log_good = fails * math.log(ff) + passes * math.log(1 - ff)
    odds = math.log(1 - prior_bad) - math.log(prior_bad)
    return 1 / (1 + math.exp(log_good - log_bad + odds))


def _pair_marginal(
    verdicts: Sequence[Verdict],
    counts: tuple[int, int, int, int],
    prior_bad: float,
    prior: FlakePrior,
) -> float:
    """P(the pair is bad | its runs and the runs judged elsewhere), flake rates integrated out."""
    fails, passes = verdicts.count(Verdict.BAD), verdicts.count(Verdict.GOOD)
    e = counts
    base = _sides(prior, (e[0], e[1]), (e[2], e[3]))[0]
    log_good = _sides(prior, (e[0] + fails, e[1] + passes), (e[2], e[3]))[0] - base
    log_bad = _sides(prior, (e[0], e[1]), (e[2] + passes, e[3] + fails))[0] - base
    odds = math.log(1 - prior_bad) - math.log(prior_bad)
    return 1 / (1 + math.exp(log_good - log_bad + odds))


EXPECTED_GOOD = 0.02
"""Prior that a commit which passed before (an endpoint, a good end) is now bad."""

EndpointState = Literal["confirmed", "failed", "again"]


def endpoint_check(
    seen: Sequence[Verdict | str], expected: Verdict, tries: int = ENDPOINT_TRIES
) -> EndpointState:
    """Whether an endpoint reproduces: one run with the expected verdict confirms it.

    A flaky example must not stop the session at the start, so a contradicting run is repeated;
    the endpoint fails only when ``tries`` runs all contradict it (or it cannot be tested at all).
    """
    verdicts = [Verdict(v) for v in seen]
    if expected in verdicts:
        return "confirmed"
    if Verdict.SKIP in verdicts or len(verdicts) >= tries:
        return "failed"
    return "again"


# -- the model ------------------------------------------------------------------------------


class _Model:
    """Counts per hypothesis, the posterior and each hypothesis' predictive fail rates.

    Hypothesis ``h`` (1..count-1) = "index h is the first bad one": indices ``< h`` are good.
    Lists are indexed by ``h - 1``.
    """

    def __init__(
        self,
        count: int,
        tallies: Mapping[int, Tally],
        prior: FlakePrior,
        weights: Sequence[float] | None = None,
        rates: tuple[float, float] | None = None,
    ) -> None:
        """``rates`` (false fail, false pass) fixes the flake rates instead of the prior's
        mixture: the posterior and test gains of a model that knows them."""
        self.count = count
        self.tallies = tallies
        self.prior = prior
        self.weights = weights
        good = [tallies[i].good if i in tallies else 0 for i in range(count)]
        bad = [tallies[i].bad if i in tallies else 0 for i in range(count)]
        total_good, total_bad = sum(good), sum(bad)
        # per hypothesis: (false fails, true passes, false passes, true fails), carried included
        self.sides: list[tuple[int, int, int, int]] = []
        log_weights: list[float] = []
        self.fail_if_good: list[float] = []  # predictive P(fail) of an index before h
        self.fail_if_bad: list[float] = []  # predictive P(fail) of an index at or after h
        flaky_if: list[float] = []  # P(the example is "often flaky") under h
        passes_before = fails_before = 0
        ev = prior.evidence
        # Hypotheses between two tested indices see the same counts: one `_sides` per distinct
        # counts, not one per candidate (thousands on a long range, a few dozen tested).
        seen: dict[tuple[int, int, int, int], tuple[float, float, float, float]] = {}
        for h in range(1, count):
            passes_before += good[h - 1]
            fails_before += bad[h - 1]
            passes_after = total_good - passes_before
            fails_after = total_bad - fails_before
            # good side: errors are fails; bad side: errors are passes
            counts = (
                fails_before + ev[0],
                passes_before + ev[1],
                passes_after + ev[2],
                fails_after + ev[3],
            )
            self.sides.append(counts)
            if counts not in seen:
                seen[counts] = _sides(prior, counts[:2], counts[2:])
            log_ml, error_good, error_bad, flaky = seen[counts]
            log_weights.append(log_ml + (math.log(weights[h]) if weights is not None else 0.0))
            self.fail_if_good.append(error_good)
            self.fail_if_bad.append(1 - error_bad)
            flaky_if.append(flaky)
        if rates is not None:
            log_weights = self.fixed_log_likelihoods(*rates)
            self.fail_if_good = [rates[0]] * (count - 1)
            self.fail_if_bad = [1 - rates[1]] * (count - 1)
        top = max(log_weights)
        scaled = [math.exp(w - top) for w in log_weights]
        total = sum(scaled)
        self.posterior = [w / total for w in scaled]
        self.flaky = sum(p * f for p, f in zip(self.posterior, flaky_if, strict=True))

    @property
    def errors(self) -> list[int]:
        """How many runs each hypothesis calls lies."""
        return [s[0] + s[2] for s in self.sides]

    def fixed_log_likelihoods(self, false_fail: float, false_pass: float) -> list[float]:
        """log(weight * P(runs | h)) of each hypothesis with the flake rates known."""
        lf, lt = math.log(false_fail), math.log(1 - false_fail)
        lp, lb = math.log(false_pass), math.log(1 - false_pass)
        out = []
        for h, (ff, tp, fp, tf) in enumerate(self.sides, start=1):
            w = math.log(self.weights[h]) if self.weights is not None else 0.0
            out.append(w + ff * lf + tp * lt + fp * lp + tf * lb)
        return out

    def with_rates(self, false_fail: float, false_pass: float) -> _Model:
        """This record's model with the flake rates known: its posterior and test gains."""
        rates = (false_fail, false_pass)
        return _Model(self.count, self.tallies, self.prior, self.weights, rates)

    def best_test(self, retest_endpoints: bool = True) -> int | None:
        """The testable index with the largest expected information gain, or None if no test
        can tell anything (every candidate index is untestable)."""
        gains = self.gains()
        testable = [
            i
            for i in range(self.count)
            if self.tallies.get(i, Tally()).skip == 0
            and (retest_endpoints or 0 < i < self.count - 1)
        ]
        if not testable:
            return None
        # Ties (common on a fresh, flat posterior; gains within a millionth of a bit count as
        # tied, so a real difference such as an even split against an uneven one is kept) go to
        # the index nearest the posterior median, then to one not tested yet, then to the lower
        # index, as plain bisection would: deterministic, so replay agrees.
        median = self._median()

        def key(i: int) -> tuple[float, float, int, int]:
            return (round(gains[i], 6), -abs(i - median), -self.tallies.get(i, Tally()).runs, -i)

        best = max(testable, key=key)
        if gains[best] <= 1e-9:
            return None
        # A new commit inside a consistent record's range splits it as plain bisection would.
        band = self._plain_band()
        if band is not None and band[0] < best < band[1]:
            kept = [i for i in testable if band[2] <= i <= band[3]]
            best = max(kept, key=key, default=best)
        return best

    def _plain_band(self) -> tuple[int, int, int, int] | None:
        """A consistent record's last pass and first fail, and the picks between them that keep
        plain bisection's worst case, as (last good, first bad, first, last); None when the
        record contradicts itself or the range is settled.

        Plain bisection needs ceil(log2 n) more steps for the n hypotheses of the open range.
        The gain can prefer an uneven split (hypotheses outside the range, which need a lie,
        keep some probability; a second level starts with plenty of it), and an uneven split
        costs a deterministic example a step more at worst.
        """
        last_good = max((i for i, t in self.tallies.items() if t.good), default=0)
        first_bad = min((i for i, t in self.tallies.items() if t.bad), default=self.count - 1)
        if first_bad - last_good <= 2:  # a pass at or after a fail, or the range is settled
            return None
        half = 2 ** (math.ceil(math.log2(first_bad - last_good)) - 1)
        # fail: first bad in last_good+1..i (i - last_good); pass: i+1..first_bad
        first, last = max(last_good + 1, first_bad - half), min(first_bad - 1, last_good + half)
        return last_good, first_bad, first, last

    def _median(self) -> float:
        cumulative = 0.0
        for h, p in enumerate(self.posterior, start=1):
            cumulative += p
            if cumulative >= 0.5:
                return h - 0.5  # between the last good (h-1) and the first bad (h)
        return self.count - 1.5

    def gains(self) -> list[float]:
        """Expected entropy drop (bits) of one more run at each index ``0..count-1``.

        Testing index i: hypotheses h <= i see a bad commit, h > i a good one; both the
        outcome's probability and the posterior's entropy after it are prefix/suffix sums,
        so all indices cost O(count) together.
        """
        p = self.posterior
        n = len(p)
        terms = []
        for fail in (True, False):
            if_bad = [
                pi * (r if fail else 1 - r) for pi, r in zip(p, self.fail_if_bad, strict=True)
            ]
            if_good = [
                pi * (r if fail else 1 - r) for pi, r in zip(p, self.fail_if_good, strict=True)
            ]
            terms.append((if_bad, if_good))
        current = -sum(_xlogx(x) for x in p)
        # prefix over "h <= i" uses if_bad, suffix over "h > i" uses if_good.
        expected = [0.0] * self.count
        for if_bad, if_good in terms:
            prefix_w = [0.0] * (n + 1)
            prefix_wl = [0.0] * (n + 1)
            for k in range(n):
                prefix_w[k + 1] = prefix_w[k] + if_bad[k]
                prefix_wl[k + 1] = prefix_wl[k] + _xlogx(if_bad[k])
            suffix_w = [0.0] * (n + 1)
            suffix_wl = [0.0] * (n + 1)
            for k in range(n - 1, -1, -1):
                suffix_w[k] = suffix_w[k + 1] + if_good[k]
                suffix_wl[k] = suffix_wl[k + 1] + _xlogx(if_good[k])
            for i in range(self.count):
                # hypotheses h = 1..i (list positions 0..i-1) are bad at index i
                z = prefix_w[i] + suffix_w[i]
                wl = prefix_wl[i] + suffix_wl[i]
                # z * H(posterior | outcome) = z log z - sum w log w; the gain subtracts it
                expected[i] += wl - _xlogx(z)
        return [current + e for e in expected]


def _xlogx(x: float) -> float:
    return x * math.log2(x) if x > 0 else 0.0


def _sides(
    prior: FlakePrior, good: tuple[int, int], bad: tuple[int, int]
) -> tuple[float, float, float, float]:
    """Log marginal likelihood of both sides' runs, each side's predictive error rate, and the
    posterior weight of the "often flaky" component.

    ``good``/``bad`` are (errors, correct) on each side. Whether the example is "rarely" or
    "often" flaky is one switch shared by both sides (each side keeps its own rate within it):
    clean runs anywhere make the whole example look deterministic sooner, and contradictions on
    one side make the other side's lone verdicts less trusted too.
    """
    parts = []
    for weight, (a, b) in ((1 - prior.high_weight, prior.low), (prior.high_weight, prior.high)):
        if weight <= 0:
            parts.append((-math.inf, [0.0, 0.0]))
            continue
        log_ml = math.log(weight)
        rates = []
        for errors, correct in (good, bad):
            log_ml += _log_beta(a + errors, b + correct) - _log_beta(a, b)
            rates.append((a + errors) / (a + b + errors + correct))
        parts.append((log_ml, rates))
    top = max(log_ml for log_ml, _ in parts)
    scaled = [(math.exp(log_ml - top), rates) for log_ml, rates in parts]
    total = sum(w for w, _ in scaled)
    error_good = sum(w * rates[0] for w, rates in scaled) / total
    error_bad = sum(w * rates[1] for w, rates in scaled) / total
    return top + math.log(total), error_good, error_bad, scaled[1][0] / total


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _blocks(
    count: int, tallies: Mapping[int, Tally], probs: Sequence[float]
) -> tuple[tuple[int, int, float], ...]:
    """Pool hypotheses h and h+1 when index h is untestable and has no verdict: no run tells
    them apart."""
    blocks: list[tuple[int, int, float]] = []
    first, mass = 1, 0.0
    for h in range(1, count):
        mass += probs[h - 1]
        t = tallies.get(h, Tally())
        pooled = h < count - 1 and t.skip > 0 and t.good == 0 and t.bad == 0
        if not pooled:
            blocks.append((first, h, mass))
            first, mass = h + 1, 0.0
    return tuple(blocks)


def _checked(count: int, observations: Mapping[int, Sequence[Verdict | str]]) -> dict[int, Tally]:
    if count < 2:
        raise ValueError(f"a bisect needs at least 2 candidates (good and bad), got count={count}")
    for i in observations:
        if not 0 <= i < count:
            raise ValueError(f"verdict for index {i} is outside the candidates 0..{count - 1}")
    return tally(observations)
