"""Drives a whole two-level bisect from the ledger.

The session decides *what* to test; a `Tester` decides *how* (export, build, image, run). With the
Docker tester it runs a bisect; with a tester that only reads the ledger it replays one, which is
how `status` and `report` rebuild their picture without touching Docker. Git is only reached
through `History` and the `simpler_states` callable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Literal, Protocol

from runner.confidence import (
    DEFAULT_CONFIDENCE,
    EXPECTED_GOOD,
    REPLICATE,
    Belief,
    Descend,
    FlakePrior,
    LowConfidence,
    belief,
    bisection_steps,
    boundary_runs,
    decide,
    endpoint_check,
    evidence,
    pair_verdict,
    tally,
    why_low,
)
from runner.errors import BisectError
from runner.history import METADATA_PATHS, Change, ChangeKind, History
from runner.ledger import Attempt, Level, judged
from runner.rounds import (
    Policy,
    aggregate,
    cache_aware,
    posterior_round,
    repeat_round,
    round_outcomes,
    verdicts_of,
    with_outcome,
)
from runner.search import (
    Found,
    Inconclusive,
    Step,
    Test,
    Verdict,
    bounds,
    steps_left,
)
from runner.verdict import Tolerance
from runner.wording import counted

Source = Literal["pypto", "simpler", "inconclusive"]
Lookup = Callable[[str, str | None], Sequence[Attempt]]
"""Every recorded attempt for a (pypto, simpler) pair, oldest first."""
SimplerStates = Callable[[str, str], tuple[str, list[str]]]

# Which recorded attempts a stage may use: its own and those of the stages before it. A level
# never sees attempts a later stage made, so a resumed session loads exactly what the
# uninterrupted one had seen at the same point and takes the same decisions.
_STAGES: dict[str, int] = {"pypto": 0, "split": 1, "simpler": 2, "drift": 3}


class Pending(Exception):
    """Raised by a replaying tester: the bisect needs a test the ledger does not hold yet (and,
    in a round of several devices, `also` these pairs with it)."""

    def __init__(
        self,
        level: Level,
        pypto: str,
        simpler: str | None,
        also: Sequence[tuple[str, str | None]] = (),
    ) -> None:
        pairs = [(pypto, simpler), *also]
        named = " and ".join(f"{p[:12]} with simpler {(s or 'none')[:12]}" for p, s in pairs)
        super().__init__(f"{level} test{'s' if also else ''} of {named}")
        self.level = level
        self.pypto = pypto
        self.simpler = simpler
        self.also = tuple(also)


class Tester(Protocol):
    """Runs tests. A tester may also offer, and the session then uses:

    - ``parallel`` (int): how many tests one round can run, and
      ``test_round(requests, done)``: run them at once, calling ``done(attempt)`` as each ends;
    - ``prefetch(pairs, testing)``: build what the next rounds may need while this round's
      `testing` pairs run;
    - ``cached(pypto, simpler)``: whether a pair's wheels are built already;
    - ``reads_runtime(pypto)``: build that commit's wheel for another simpler commit than it
      pins with the runtime at that commit (its build reads the runtime's files).
    """

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt: ...


@dataclass(frozen=True)
class Request:
    level: Level
    pypto: str
    simpler: str | None


# A tester's `test_round(requests, done, more)` asks `more(attempt, index, pending)` after each
# attempt: the requests to start now, and whether they join the round of the last ones started.
More = Callable[[Attempt, int, list[int]], tuple[Sequence[Request], bool]]


class Events(Protocol):
    def level_started(self, level: Level, count: int, note: str) -> None: ...
    def step_started(
        self,
        level: Level,
        done: int,
        left: int,
        pypto: str,
        simpler: str | None,
        subject: str,
        check: str = "",
    ) -> None: ...
    def attempt_done(
        self, attempt: Attempt, reused: bool, subject: str, check: str = ""
    ) -> None: ...
    def note(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...


class QuietEvents:
    def level_started(self, level: Level, count: int, note: str) -> None:
        pass

    def step_started(
        self,
        level: Level,
        done: int,
        left: int,
        pypto: str,
        simpler: str | None,
        subject: str,
        check: str = "",
    ) -> None:
        pass

    def attempt_done(self, attempt: Attempt, reused: bool, subject: str, check: str = "") -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass


def _again(runs: int) -> str:
    """The label of a pair's run after `runs` earlier ones."""
    return f"re-test, run {runs + 1}" if runs else ""


EARLY_START = 0.8
"""The posterior's mass on a round's likeliest outcome, its finished tests counted, from which
a free device starts the next round's pick before the round's other tests end (several
devices: `Session._bisect_pipelined`). A deterministic example's picks are then the very ones
the round's end gives; a flaky one's may be one run more."""


def _missing(wanted: Sequence[int], picks: Sequence[int]) -> list[int]:
    """The items of `wanted` that `picks` does not hold (as many times as wanted)."""
    left = list(picks)
    missing = []
    for item in wanted:
        if item in left:
            left.remove(item)
        else:
            missing.append(item)
    return missing


def _chance(
    probabilities: Sequence[float], tested: Sequence[int], outcome: Sequence[Verdict]
) -> float:
    """The posterior's mass on `outcome` of testing `tested` (a monotone outcome: the lowest of
    them pass): the first bad commit lies between the last one it passes and the first it fails."""
    cuts = [-1, *sorted(tested), len(probabilities) - 1]
    passing = sum(v is Verdict.GOOD for v in outcome)
    return float(sum(probabilities[cuts[passing] + 1 : cuts[passing + 1] + 1]))


DRIFT_STREAK = 3
"""Failures in a row, one of a commit that passed before, that make the session re-run the
known-good commit mid-search (`Session._drift_midway`)."""
DRIFT_RUNS = 8
"""Failures in a row of the known-good commit then that stop the session as drifted (an
example with 30 % false fails does that in 0.007 % of the checks)."""


class _Drifted(Exception):
    """The known-good commit fails mid-session: what failed, and how it was found."""

    def __init__(self, what: str, how: str) -> None:
        super().__init__(what)
        self.what = what
        self.how = how


class EndpointFailure(Exception):
    """An endpoint did not give its expected verdict; carries the attempt for the message."""

    def __init__(self, which: Literal["good", "bad"], attempt: Attempt) -> None:
        super().__init__(which)
        self.which = which
        self.attempt = attempt


@dataclass
class LevelResult:
    """One level's bisect: candidates[0] is known good, candidates[-1] known bad.

    ``observations`` holds every verdict per candidate index, repeats included, in order, and
    ``runs`` the ledger's run ids behind them (a verdict taken from the level above, not from a
    run of this pair, has none): the report's figures are those runs'.
    """

    level: Level
    candidates: list[str]
    anchor: str | None = None  # simpler level: the pypto commit every state is tested with
    observations: dict[int, list[Verdict]] = field(default_factory=dict)
    runs: dict[int, list[str]] = field(default_factory=dict)
    found: int | None = None
    inconclusive: tuple[int, int] | None = None
    low_confidence: tuple[tuple[int, float], ...] | None = None
    tests: int = 0
    rounds: int = 0  # rounds of tests run at once (equal to tests with one device)
    belief: Belief | None = None
    repeat: int | None = None  # fixed repeats per commit instead of the confidence search
    policy: Policy = "majority"
    prior: FlakePrior | None = None  # the simpler level starts from what level one learnt
    weights: tuple[float, ...] | None = None  # prior weight of each first-bad hypothesis
    descend: frozenset[int] = frozenset()  # candidates a second level refines (pointer moves)
    descended: bool = False  # stopped at a pointer move: the second level checks the boundary
    pairs: dict[str, tuple[str, str | None]] | None = None  # a joint chain: label -> pair to run
    # What plain bisection spends at worst on the runs this level counts (its boundary may use
    # what that and the allowance leave); None: this level's endpoints and ceil(log2) steps.
    plain: int | None = None
    good_runs: int = REPLICATE  # passes the last good commit needs (`Session._last_good_runs`)
    # Every counted run in the order they finished: (finished at, run id, index, verdict).
    timeline: list[tuple[datetime, str, int, Verdict]] = field(default_factory=list)
    # The drift check's runs of a candidate at the end: shown beside its runs, not evidence.
    checks: dict[int, list[Verdict]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return (
            self.found is not None
            or self.inconclusive is not None
            or self.low_confidence is not None
        )

    @property
    def verdicts(self) -> dict[int, Verdict]:
        """One verdict per tested index: the policy's (fixed repeats) or the majority's."""
        return verdicts_of(self.observations, self.repeat, self.policy)

    @property
    def first_bad(self) -> str | None:
        return None if self.found is None else self.candidates[self.found]

    @property
    def last_good(self) -> str | None:
        """The answer's last good candidate (before a culprit, or an untestable stretch)."""
        answered = self.found is not None or self.inconclusive is not None
        return self.candidates[self.bounds[0]] if answered else None

    @property
    def bounds(self) -> tuple[int, int]:
        """The last good and the first bad index: an answer's, else the range plain bisection
        would still search."""
        if self.found is not None:
            return self.found - 1, self.found
        if self.inconclusive is not None:
            return self.inconclusive[0] - 1, self.inconclusive[1]
        return bounds(len(self.candidates), self.verdicts)

    @property
    def probability(self) -> float | None:
        """The culprit's posterior probability (confidence search only)."""
        if self.belief is None or self.found is None:
            return None
        return self.belief.probabilities[self.found]

    @property
    def runner_up(self) -> tuple[int, float] | None:
        """The index second likeliest to be the first bad one, and its probability."""
        if self.belief is None:
            return None
        ranked = list(self.belief.ranked(mass=1.0, limit=3))
        # Second to the culprit, or, with none named, to the likeliest candidate.
        top = self.found if self.found is not None else (ranked[0][0] if ranked else None)
        ranked = [(i, p) for i, p in ranked if i != top]
        return ranked[0] if ranked else None

    @property
    def suspects(self) -> list[str]:
        """Every candidate that can still be the first bad one."""
        if self.found is not None:
            return [self.candidates[self.found]]
        if self.inconclusive is not None:
            first, last = self.inconclusive
            return self.candidates[first : last + 1]
        if self.low_confidence is not None:
            return [self.candidates[i] for i, _ in self.low_confidence]
        if self.repeat is None and self.belief is not None:
            return [self.candidates[i] for i, _ in self.belief.ranked()]
        lo, hi = bounds(len(self.candidates), self.verdicts)
        return self.candidates[lo + 1 : hi + 1]

    @property
    def steps_left(self) -> int:
        if self.done:
            return 0
        if self.repeat is None:
            if self.belief is None:
                return steps_left(len(self.candidates), {}) + self._reruns
            return self._confidence_steps_left(self.belief)
        return steps_left(len(self.candidates), self.verdicts) * self.repeat

    def _confidence_steps_left(self, belief: Belief) -> int:
        """The confidence search's tests still to come: the bits left to learn, then the
        boundary's re-runs; once the likeliest block holds half the probability and both sides
        of its boundary have run, the runs that boundary still needs (`boundary_runs`)."""
        first, last, mass = belief.top_block
        sides = (first - 1, last)
        if mass >= 0.5 and all(i in belief.tallies or i in (0, belief.count - 1) for i in sides):
            return max(1, len(boundary_runs(belief, self.good_runs, self.plain)))
        return max(1, round(belief.entropy)) + self._reruns

    @property
    def _reruns(self) -> int:
        """What a boundary found by bisection usually needs after it: each side's runs up to
        `REPLICATE`, and the last good commit's up to `good_runs`."""
        return 2 * (REPLICATE - 1) + self.good_runs - REPLICATE


@dataclass
class Split:
    """The code-vs-pointer tests of a culprit that changes pypto code and moves the pointer."""

    pointer_half: Verdict  # pypto at the parent, simpler at the new pointer
    code_half: Verdict  # pypto at the culprit, simpler at the old pointer
    carrier: Literal["pointer", "code", "both", "interaction", "unknown"]
    anchor: str | None = None  # the pypto commit to bisect simpler with; None: no second level


@dataclass
class _Chain:
    """A joint chain (see `Session._joint`) and how its links map back to both levels."""

    result: LevelResult
    links: list[list[tuple[str, str | None]]]
    origin: list[int]  # the pypto candidate each link's hypothesis blames
    at_state: dict[int, int]  # link -> simpler state index


@dataclass
class Outcome:
    source: Source
    pypto: LevelResult
    change: Change | None = None
    split: Split | None = None
    simpler: LevelResult | None = None
    direction: str | None = None
    notes: list[str] = field(default_factory=list)
    pending: Pending | None = None  # replay stopped here: the bisect is not finished
    endpoint_failure: str | None = None  # an endpoint did not reproduce: nothing was bisected
    rejudged: str | None = None  # `report --rethreshold`: the limits the ledger was re-judged by
    running: bool = False  # `report` while a run holds the workdir: it is not finished yet
    merge_base_index: int = -1  # diverged pointers: where the path turns from backward to forward
    confidence: float = DEFAULT_CONFIDENCE  # the probability a culprit had to reach
    drift: list[str] = field(default_factory=list)  # good commits that failed re-run at the end
    # Going backward, a merge's line bisected in reverse, down to where it starts on the side of
    # the merge's parent: that state -> the merge. Passing from it to the parent drops the
    # merge as a whole, not that state.
    dropped_merges: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.pending is None

    @property
    def exit_code(self) -> int:
        if self.endpoint_failure is not None or self.drift:
            return 3
        if self.source == "inconclusive":
            return 1
        if self.source == "simpler" and self.simpler is not None and self.simpler.found is None:
            return 1
        if self.pypto.found is None and self.pypto.inconclusive is not None:
            return 1  # the simpler culprit is known, not the pypto bump that brought it
        return 0

    @property
    def simpler_culprit(self) -> str | None:
        """The simpler commit to blame: the first bad state going forward; going backward, the
        commit whose removal brought the regression back."""
        level = self.simpler
        if level is None or level.found is None:
            return None
        return self.blamed(level, level.found)

    def blamed(self, level: LevelResult, index: int) -> str:
        """The commit that `index` as `level`'s first bad state blames: that state, or, where
        the simpler pointer moves backward, the state before it (the commit whose removal
        brought the regression back)."""
        if level is self.simpler and index > 0 and self._backward_step(index):
            before = level.candidates[index - 1]
            return self.dropped_merges.get(before, before)
        return level.candidates[index]

    def _backward_step(self, index: int) -> bool:
        return self.direction == "backward" or (
            self.direction == "diverged" and index <= self.merge_base_index
        )


class Session:
    def __init__(
        self,
        history: History,
        tester: Tester,
        lookup: Lookup,
        *,
        good: str,
        bad: str,
        submodule_path: str = "runtime",
        verify: bool = True,
        simpler_states: SimplerStates,
        merge_base: Callable[[str, str], str | None] | None = None,
        simpler_subject: Callable[[str], str] | None = None,
        merged_line: Callable[[str, str], list[str]] | None = None,
        reads_runtime: Callable[[str], bool] | None = None,
        events: Events | None = None,
        confidence: float = DEFAULT_CONFIDENCE,
        repeat: int | None = None,
        policy: Policy = "majority",
        tolerance: Tolerance | None = None,
        drift_check: bool = True,
    ) -> None:
        if repeat is not None and repeat < 1:
            raise BisectError(f"--repeat must be at least 1, got {repeat}")
        self.history = history
        self.tester = tester
        self.lookup = lookup
        self.good = good
        self.bad = bad
        self.path = submodule_path
        self.verify = verify
        self.simpler_states = simpler_states
        self._ranges: dict[tuple[str, str], tuple[str, list[str]] | BisectError] = {}
        self.merge_base = merge_base
        self.simpler_subject = simpler_subject
        # (merge, the parent the search reached it through) -> what the merge brings from its
        # other parent, oldest first; [] when it is no two-parent merge with that parent
        self.merged_line = merged_line
        self._lines: dict[tuple[str, str], list[str]] = {}
        self._held: dict[tuple[str, str], bool] = {}  # (pointer, state) -> `_holds`
        # commit -> whether its build files show that its build reads the runtime's files
        self.reads_runtime = reads_runtime
        self.events = events or QuietEvents()
        self.confidence = confidence
        self.repeat = repeat
        self.policy: Policy = policy
        self.tolerance = tolerance
        self.drift_check = drift_check
        self._times: list[datetime] = []  # when each attempt of the bisect stages finished
        self._fresh: set[str] = set()  # run ids of the attempts this invocation ran
        # The latest run a level counted, loaded or new: drift runs before it checked the
        # environment of another moment (`_drift_midway`), not of the end.
        self._last_search: tuple[datetime, str] = (datetime.min.replace(tzinfo=timezone.utc), "")
        self._gitlinks: dict[str, str | None] = {}
        self._last_good: tuple[str, str | None] | None = None  # the joint chain's, when it ran
        self._chain: LevelResult | None = None
        self._moved_to: int | None = None  # the pointer move a descent's runs pointed to instead
        # A descent's bump whose own pair passed: level one goes on with that commit good
        self._own_passed: int | None = None
        self._subjects: dict[str, str] = {}

    def subject(self, pypto: str, simpler: str | None = None, level: Level = "pypto") -> str:
        """What the progress shows: the simpler commit's subject on the simpler level."""
        key = simpler if level == "simpler" and simpler and self.simpler_subject else pypto
        if key not in self._subjects:
            try:
                describe = self.simpler_subject if key != pypto else self.history.subject
                self._subjects[key] = describe(key) if describe else ""
            except BisectError:
                self._subjects[key] = ""
        return self._subjects[key]

    def gitlink(self, commit: str) -> str | None:
        if commit not in self._gitlinks:
            self._gitlinks[commit] = self.history.gitlink(commit, self.path)
        return self._gitlinks[commit]

    def _recorded(
        self, stage: Level, pypto: str, simpler: str | None, *, used: bool = True
    ) -> list[Attempt]:
        """The attempts the ledger holds for a pair, from this stage and the ones before it;
        `used`: the session counts them as evidence (not when it only plans ahead)."""
        limit = _STAGES[stage]
        seen = []
        for attempt in self.lookup(pypto, simpler):
            if _STAGES.get(attempt.level, 99) <= limit:
                if used:
                    self._saw(attempt)
                seen.append(attempt)
        return seen

    def _count(self, result: LevelResult, index: int, attempts: Sequence[Attempt]) -> None:
        """Put runs of the candidate at `index` into the level's observations."""
        result.observations.setdefault(index, []).extend(self.verdict(a) for a in attempts)
        result.runs.setdefault(index, []).extend(a.run_id for a in attempts)
        result.timeline.extend((a.finished_at, a.run_id, index, self.verdict(a)) for a in attempts)
        for attempt in attempts:
            self._last_search = max(self._last_search, (attempt.finished_at, attempt.run_id))

    def _saw(self, attempt: Attempt) -> None:
        if attempt.level != "drift":
            self._times.append(attempt.finished_at)

    def verdict(self, attempt: Attempt) -> Verdict:
        """The attempt's verdict under the session's tolerance, else the example's own."""
        if self.tolerance is None:
            return attempt.verdict
        return self.tolerance.apply(attempt.verdict, attempt.metrics)

    def _run_once(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        return self._run_round([Request(level, pypto, simpler)])[0]

    @property
    def parallel(self) -> int:
        return max(1, int(getattr(self.tester, "parallel", 1)))

    def _run_round(self, requests: Sequence[Request], checks: Sequence[str] = ()) -> list[Attempt]:
        """Run a round of tests (at once when the tester can); events as each one ends.
        `checks`: what each request checks ("re-test, run 2"), for the line it ends with."""
        labels: dict[tuple[str, str, str | None], list[str]] = {}
        self._label(labels, requests, checks)
        done = self._announcer(labels)
        run_round = getattr(self.tester, "test_round", None)
        if run_round is not None:
            return list(run_round(requests, done))
        attempts = []
        for request in requests:
            attempt = self.tester.test(request.level, request.pypto, request.simpler)
            done(attempt)
            attempts.append(attempt)
        return attempts

    @staticmethod
    def _label(
        labels: dict[tuple[str, str, str | None], list[str]],
        requests: Sequence[Request],
        checks: Sequence[str],
    ) -> None:
        for request, check in zip(requests, checks, strict=False):
            labels.setdefault((request.level, request.pypto, request.simpler), []).append(check)

    def _announcer(
        self, labels: dict[tuple[str, str, str | None], list[str]]
    ) -> Callable[[Attempt], None]:
        """What is said as each attempt ends, with what it checked (`labels`, per pair)."""

        def done(attempt: Attempt) -> None:
            self._fresh.add(attempt.run_id)
            self._saw(attempt)
            left = labels.get((attempt.level, attempt.pypto_sha, attempt.simpler_sha))
            shown = attempt
            if attempt.level == "simpler" and attempt.simpler_sha == self.gitlink(
                attempt.pypto_sha
            ):
                # The joint chain's run of a pypto commit with its own pointer: recorded at the
                # stage that ran it (see `_project`), a run of level one's pair all the same.
                shown = attempt.model_copy(update={"level": "pypto"})
            self.events.attempt_done(
                judged(shown, self.tolerance),
                reused=False,
                subject=self.subject(shown.pypto_sha, shown.simpler_sha, shown.level),
                check=left.pop(0) if left else "",
            )

        return done

    # -- level runner ----------------------------------------------------------------------

    def _load(self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]]) -> None:
        """Put every recorded verdict of the level's pairs into its observations."""
        loaded: list[Attempt] = []
        for index, commit in enumerate(result.candidates):
            seen = self._recorded(result.level, *pair(commit))
            if seen:
                self._count(result, index, seen)
                loaded += seen
        self._reused(result.level, loaded)

    def _reused(self, kind: str, attempts: Iterable[Attempt], level: str | None = None) -> None:
        """Say how many verdicts of a kind (the `attempts` of `level`, or all) a resumed session
        took from the ledger: runs of an earlier invocation, not of this one."""
        count = sum(
            1
            for a in attempts
            if a.run_id not in self._fresh and (level is None or a.level == level)
        )
        if count:
            self.events.note(f"{counted(count, f'{kind} verdict')} reused from the ledger")

    def _ends_due(self, result: LevelResult) -> int:
        """The first level's endpoint checks not run yet: the step estimate counts the steps
        that narrow the range, and these narrow nothing (without them the estimate grew by one
        with each)."""
        if result.level != "pypto" or not self.verify or result.done:
            return 0
        ends = (0, len(result.candidates) - 1)
        return sum(1 for i in ends if not result.observations.get(i))

    def _check(self, result: LevelResult, index: int, earlier: int = 0) -> str:
        """What a test checks, for the progress: a first-level end's first run is the endpoint
        check, later ones re-test it (flakiness, drift); another commit's later runs are
        re-tests (the boundary's, a flaky commit's). `earlier`: runs of it in the same round."""
        runs = len(result.observations.get(index, ())) + earlier
        if result.level == "pypto" and index in (0, len(result.candidates) - 1):
            end = "good" if index == 0 else "bad"
            return f"{'re-test of the' if runs else 'check of the'} known-{end} end"
        return _again(runs)

    def _step(
        self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]], index: int
    ) -> Attempt:
        return self._steps(result, pair, (index,))[0]

    def _steps(
        self,
        result: LevelResult,
        pair: Callable[[str], tuple[str, str | None]],
        indices: Sequence[int],
    ) -> list[Attempt]:
        """One round: test the candidates at `indices` at once (one per device)."""
        requests, checks = self._requests(result, pair, indices)
        attempts = self._run_round(requests, checks)
        for index, attempt in zip(indices, attempts, strict=True):
            result.tests += 1
            self._count(result, index, [attempt])
        result.rounds += 1
        return attempts

    def _requests(
        self,
        result: LevelResult,
        pair: Callable[[str], tuple[str, str | None]],
        indices: Sequence[int],
        running: Sequence[int] = (),
    ) -> tuple[list[Request], list[str]]:
        """The requests that test the candidates at `indices`, said as each starts, with what
        each checks; `running`: candidates whose runs are under way (not counted yet)."""
        requests, checks = [], []
        for number, index in enumerate(indices):
            pypto, simpler = pair(result.candidates[index])
            earlier = indices[:number].count(index) + list(running).count(index)
            checks.append(self._check(result, index, earlier=earlier))
            self.events.step_started(
                result.level,
                result.tests,
                result.steps_left + self._ends_due(result),
                pypto,
                simpler,
                self.subject(pypto, simpler, result.level),
                checks[-1],
            )
            requests.append(Request(result.level, pypto, simpler))
        return requests, checks

    # -- choosing a round's tests ----------------------------------------------------------

    def _picks(
        self, result: LevelResult, observations: Mapping[int, Sequence[Verdict]]
    ) -> Step | LowConfidence | Descend:
        """What the level does next from `observations`: Found/Inconclusive/LowConfidence, or
        the indices of the next round (up to one per device). The choice is `rounds.py`'s; this
        adds the session's settings and the tester's wheel cache."""
        count = len(result.candidates)
        k = self.parallel

        def pivot(verdicts: Mapping[int, Verdict], pick: int) -> int:
            return self._cache_aware(result, verdicts, pick)

        if self.repeat is not None:
            return repeat_round(
                count, observations, k=k, repeat=self.repeat, policy=self.policy, pivot=pivot
            )
        step = decide(
            count,
            observations,
            confidence=self.confidence,
            prior=result.prior,
            retest_endpoints=self.verify or (result.level == "simpler" and result.pairs is None),
            weights=result.weights,
            descend=result.descend,
            last_good_runs=self._last_good_runs,
            plain=result.plain,
        )
        if not isinstance(step, Test):
            return step
        if k == 1:
            return Test((pivot(verdicts_of(observations, None, "majority"), step.indices[0]),))
        return posterior_round(
            belief(count, observations, result.prior, result.weights),
            step.indices[0],
            k=k,
            last_good_runs=self._last_good_runs,
            plain=result.plain,
        )

    @property
    def _last_good_runs(self) -> int:
        """Passes the last good commit needs: one more than `REPLICATE` when the drift check
        follows, because that last run also shows that good commits still pass at the end (see
        `_check_drift`); the boundary's weak side then gets a third run at no extra cost."""
        return REPLICATE + 1 if self.drift_check and self.verify else REPLICATE

    def _cache_aware(self, result: LevelResult, verdicts: Mapping[int, Verdict], pick: int) -> int:
        """`cache_aware` with the tester's wheel cache (a tester without one: the pick)."""
        cached = getattr(self.tester, "cached", None)
        if cached is None:
            return pick
        pair = self._pair(result)
        return cache_aware(
            len(result.candidates), verdicts, pick, lambda i: cached(*pair(result.candidates[i]))
        )

    def _pair(self, result: LevelResult) -> Callable[[str], tuple[str, str | None]]:
        if result.pairs is not None:
            pairs = result.pairs
            return lambda label: pairs[label]
        if result.level == "simpler":
            anchor = result.anchor or ""
            return lambda state: (anchor, state)
        return lambda commit: (commit, self.gitlink(commit))

    def _prefetch(
        self,
        result: LevelResult,
        picks: Sequence[int],
        observations: Mapping[int, Sequence[Verdict]] | None = None,
        *,
        testing: Sequence[int] | None = None,
        certain: Sequence[int] = (),
    ) -> None:
        """While this round runs, build what the next two rounds may test: the next round's
        picks for each outcome of this one (most likely first), then the round after those.

        `observations`: an assumed record (default: the real one). `testing`: what runs now,
        when `picks` is a round still to come: then `picks` itself is built ahead, first.
        `certain`: tests due before `picks` whatever this round gives (an endpoint still to
        check), built ahead before anything else.
        """
        prefetch = getattr(self.tester, "prefetch", None)
        if prefetch is None:
            return
        pair = self._pair(result)
        ahead = [*certain, *picks] if testing is not None else list(certain)
        wanted: list[tuple[str, str | None]] = [pair(result.candidates[i]) for i in ahead]
        states: list[tuple[Mapping[int, Sequence[Verdict]], tuple[int, ...]]] = [
            (result.observations if observations is None else observations, tuple(picks))
        ]
        # Two rounds ahead with one device (two, then four pairs); one with several, whose
        # (k + 1) outcomes already name k (k + 1) pairs.
        for _depth in range(2 if len(picks) == 1 else 1):
            following = []
            for observations, tested in states:
                for outcome in self._likeliest_first(result, observations, tested):
                    fantasy = with_outcome(observations, tested, outcome)
                    try:
                        step = self._picks(result, fantasy)
                    except ValueError:
                        continue
                    if isinstance(step, Test):
                        for index in step.indices:
                            wanted.append(pair(result.candidates[index]))
                        following.append((fantasy, step.indices))
                    elif isinstance(step, Descend) and result.pairs is None:
                        wanted += self._descent_guesses(result, step.index, fantasy)
            states = following
        seen: set[tuple[str, str | None]] = set()
        ordered = [p for p in wanted if not (p in seen or seen.add(p))]
        now = picks if testing is None else testing
        prefetch(ordered, [pair(result.candidates[index]) for index in now])

    def _likeliest_first(
        self,
        result: LevelResult,
        observations: Mapping[int, Sequence[Verdict]],
        tested: Sequence[int],
    ) -> list[tuple[Verdict, ...]]:
        """The outcomes of testing `tested`, the likeliest first under the level's posterior
        (ties: the middle boundary first). A guess for the likelier outcome gets the build
        slots first, which counts when the slots cannot build both before the round ends."""
        if self.repeat is not None or len(tested) == 0:
            return round_outcomes(tested)
        return [outcome for outcome, _ in self._ranked_outcomes(result, observations, tested)]

    @staticmethod
    def _ranked_outcomes(
        result: LevelResult,
        observations: Mapping[int, Sequence[Verdict]],
        tested: Sequence[int],
    ) -> list[tuple[tuple[Verdict, ...], float]]:
        """Each outcome of testing `tested` with its chance under the level's posterior, the
        likeliest first (ties: the middle boundary first, as `round_outcomes` orders them)."""
        probabilities = belief(
            len(result.candidates), observations, result.prior, result.weights
        ).probabilities
        chances = [(o, _chance(probabilities, tested, o)) for o in round_outcomes(tested)]
        return sorted(chances, key=lambda pair: -round(pair[1], 6))

    def _descent_guesses(
        self, first: LevelResult, c: int, observations: Mapping[int, Sequence[Verdict]]
    ) -> list[tuple[str, str | None]]:
        """What the descent into the bump at `c` tests first, had the pypto level seen
        `observations`: the split's halves when the bump changes code too, then the joint
        chain's first round, assuming that the pointer move carries the regression."""
        parent, culprit = first.candidates[c - 1], first.candidates[c]
        change = self.history.classify(culprit, self.path)
        if change.old is None or change.new is None:
            return []
        try:
            _direction, states = self._states(change.old, change.new)
        except BisectError:
            return []
        halves: list[tuple[str, str | None]] = []
        split = None
        assumed: dict[tuple[str, str | None], list[Verdict]] = {}
        if change.kind == "pointer-and-code":
            halves = [(parent, change.new), (culprit, change.old)]
            split = Split(Verdict.BAD, Verdict.GOOD, "pointer", anchor=culprit)
            assumed[(culprit, change.old)] = [Verdict.GOOD]  # the code half, as the split saw it
        chain = self._joint_chain(first, c, c, change, culprit, states, split)
        level = {(commit, self.gitlink(commit)): i for i, commit in enumerate(first.candidates)}
        runs: dict[int, list[Verdict]] = {}
        for k, pairs in enumerate(chain.links):
            for link in dict.fromkeys(pairs):
                if link in level:
                    seen = list(observations.get(level[link], []))
                elif link in assumed:
                    seen = assumed[link]
                else:
                    recorded = self._recorded("simpler", *link, used=False)
                    seen = [self.verdict(a) for a in recorded]
                if seen:
                    runs.setdefault(k, []).extend(seen)
        try:
            step = self._picks(chain.result, runs)
        except ValueError:
            return halves
        if not isinstance(step, Test):
            return halves
        pairs = chain.result.pairs or {}
        return halves + [pairs[chain.result.candidates[i]] for i in step.indices]

    def _bisect(self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]]) -> None:
        if self.repeat is not None:
            self._bisect_fixed(result, pair)
            return
        if self.parallel > 1 and getattr(self.tester, "adds_requests", False):
            self._bisect_pipelined(result, pair)
            return
        while True:
            self._drift_midway(result)
            step = self._decide(result)
            if not isinstance(step, Test):
                self._conclude(result, step)
                return
            self._prefetch(result, step.indices)
            self._steps(result, pair, step.indices)

    def _decide(self, result: LevelResult) -> Step | LowConfidence | Descend:
        """The level's next round from its runs so far, or the step that ends it (which
        `_conclude` puts into `result`)."""
        while True:
            result.belief = belief(
                len(result.candidates), result.observations, result.prior, result.weights
            )
            step = self._picks(result, result.observations)
            # (a joint chain descends into a merge's line, which `_line` found readable)
            if isinstance(step, Descend) and not (
                result.pairs is not None or self._range_readable(result.candidates[step.index])
            ):
                # No second level can check this boundary: this level confirms it itself.
                result.descend = result.descend - {step.index}
                continue
            return step

    @staticmethod
    def _conclude(result: LevelResult, step: Step | LowConfidence | Descend) -> None:
        """Put a step that ends the level into `result`."""
        if isinstance(step, Descend):
            result.found = step.index
            result.descended = True
        elif isinstance(step, Found):
            result.found = step.index
        elif isinstance(step, Inconclusive):
            result.inconclusive = (step.first, step.last)
        elif isinstance(step, LowConfidence):
            result.low_confidence = step.candidates

    def _bisect_pipelined(
        self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]]
    ) -> None:
        """The search with several devices, each device starting its next test as soon as that
        test is all but certain, not when the round's slowest test ends.

        The rounds are those `_bisect` runs: each round's picks come from every run before it.
        But while some of a round's tests still run, the outcome they will likely give (a
        pick the finished ones put outside the boundary's range repeats what they say) may make
        the next round as good as decided: when that outcome has `EARLY_START` of the
        posterior, the free devices start the next round's first picks at once. When the
        round ends, those count as its picks; a pick the real outcome did not call for is one
        more run of its commit, evidence like any other, and the level decides again once it
        ends. The answer is the one the rounds give: only the waiting goes.
        """
        k = self.parallel
        candidate: list[int] = []  # each request of the tester's call -> its candidate
        finished: set[int] = set()
        verdicts: dict[int, Verdict] = {}
        state: dict[str, list[int]] = {"round": [], "early": []}  # requests of each
        labels: dict[tuple[str, str, str | None], list[str]] = {}
        announce = self._announcer(labels)

        def start(indices: Sequence[int]) -> tuple[list[Request], list[int]]:
            running = [candidate[i] for i in range(len(candidate)) if i not in finished]
            requests, checks = self._requests(result, pair, indices, running)
            self._label(labels, requests, checks)
            placed = list(range(len(candidate), len(candidate) + len(indices)))
            candidate.extend(indices)
            return requests, placed

        def next_round() -> tuple[list[Request], bool]:
            """The round after the one that just ended, with what started early: the picks the
            round's end gives, as if the early ones had not run yet (a pick that ended early
            told what the round after it may use, as it would have ended there)."""
            result.rounds += 1
            early, state["early"] = state["early"], []
            running = [i for i in early if i not in finished]
            if not running:
                self._drift_midway(result)
            step: Step | LowConfidence | Descend | None = None
            if early:
                before = {i: list(seen) for i, seen in result.observations.items()}
                for i in early:
                    if i in finished:
                        before[candidate[i]].remove(verdicts[i])
                planned = self._picks(result, before)
                if isinstance(planned, Test) and not _missing(
                    [candidate[i] for i in early], planned.indices
                ):
                    step = planned
                    result.belief = belief(
                        len(result.candidates), result.observations, result.prior, result.weights
                    )
            if step is None:
                step = self._decide(result)
            if not isinstance(step, Test):
                if running:  # decided again once these runs are in
                    state["round"] = early
                else:
                    self._conclude(result, step)
                return [], False
            picks = _missing(step.indices, [candidate[i] for i in early])
            self._prefetch(result, step.indices)
            requests, placed = start(picks)
            state["round"] = early + placed
            return requests, bool(early)

        def early_start(pending: list[int]) -> tuple[list[Request], bool]:
            """The next round's first picks, when the pending tests' outcome is all but sure."""
            free = k - len(pending)
            if state["early"] or free <= 0:
                return [], False
            tested = [candidate[i] for i in state["round"] if i not in finished]
            ranked = self._ranked_outcomes(result, result.observations, tested)
            if not ranked or ranked[0][1] < EARLY_START:
                return [], False
            fantasy = with_outcome(result.observations, tested, ranked[0][0])
            try:
                step = self._picks(result, fantasy)
            except ValueError:
                return [], False
            if not isinstance(step, Test):
                return [], False
            requests, placed = start(step.indices[:free])
            state["early"] = placed
            return requests, False

        def more(attempt: Attempt, index: int, pending: list[int]) -> tuple[list[Request], bool]:
            finished.add(index)
            verdicts[index] = self.verdict(attempt)
            result.tests += 1
            self._count(result, candidate[index], [attempt])
            if all(i in finished for i in state["round"]):
                return next_round()
            return early_start(pending)

        while not result.done:
            self._drift_midway(result)
            step = self._decide(result)
            if not isinstance(step, Test):
                self._conclude(result, step)
                return
            candidate.clear()  # (a call's requests are numbered from 0)
            finished.clear()
            state.update(round=[], early=[])
            self._prefetch(result, step.indices)
            requests, state["round"] = start(step.indices)
            attempts = self.tester.test_round(requests, announce, more)  # type: ignore[attr-defined]
            for index, attempt in enumerate(attempts):
                if index not in finished:  # one `more` was not asked about: still a run
                    result.tests += 1
                    self._count(result, candidate[index], [attempt])

    def _bisect_fixed(
        self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]]
    ) -> None:
        """`--repeat N`: every tested commit runs N times, the policy makes one verdict of them."""
        assert self.repeat is not None
        while True:
            step = self._picks(result, result.observations)
            if isinstance(step, Found):
                result.found = step.index
                return
            if isinstance(step, Inconclusive):
                result.inconclusive = (step.first, step.last)
                return
            assert isinstance(step, Test)
            self._prefetch(result, step.indices)
            self._steps(result, pair, step.indices)

    # -- the whole bisect -------------------------------------------------------------------

    def run(self) -> Outcome:
        commits = self.history.first_parent_range(self.good, self.bad)
        first = LevelResult(
            "pypto",
            [self.good, *commits],
            repeat=self.repeat,
            policy=self.policy,
            good_runs=self._last_good_runs,
        )
        self._gitlinks.update(self.history.gitlinks(first.candidates, self.path))
        self._partial = Outcome("inconclusive", first)
        try:
            outcome = self._run(first)
            self._partial = outcome
            # Also when no culprit came out: an environment that drifted mid-session leaves
            # contradictions no flake rate explains, and says so only if the good end is re-run.
            if self.drift_check and self.verify and first.done:
                self._check_drift(outcome, first)
        except _Drifted as drifted:
            outcome = self._partial
            outcome.drift.append(drifted.what)
            outcome.notes.append(drifted.how)
        except Pending as pending:
            # Replay ran out of recorded verdicts: report how far the session got, levels included.
            self._partial.pending = pending
            outcome = self._partial
        outcome.confidence = self.confidence
        return outcome

    def _run(self, first: LevelResult) -> Outcome:
        self.events.level_started("pypto", len(first.candidates) - 1, "pypto first-parent commits")
        pypto_pair = lambda commit: (commit, self.gitlink(commit))  # noqa: E731
        self._load(first, pypto_pair)
        if self.verify:
            self._verify_endpoints(first, pypto_pair)
        if self.repeat is None:
            links = [self.gitlink(commit) for commit in first.candidates]
            first.descend = frozenset(
                i
                for i in range(1, len(links))
                if None not in (links[i - 1], links[i]) and links[i - 1] != links[i]
            )
        notes: list[str] = []
        while True:
            outcome = self._level_one(first, pypto_pair)
            if self._own_passed is None:
                outcome.notes[:0] = notes
                return outcome
            # The states inside the bump failed and the bump itself passed: its simpler range
            # brings a regression and its fix. Level one goes on past it.
            bump = first.candidates[self._own_passed]
            notes.append(
                f"simpler states inside the bump at {bump[:12]} fail, but the bump itself passes "
                "with its own pointer: a regression between its pointers is undone by its new "
                "one, so the search went on past it"
            )
            self._own_passed = None
            first.found, first.descended, first.belief = None, False, None

    def _level_one(
        self, first: LevelResult, pypto_pair: Callable[[str], tuple[str, str | None]]
    ) -> Outcome:
        """Level one's bisect from what it has seen, then the second level its culprit needs.
        A descent may find the bump it stopped at passing (`_own_passed`): the caller goes on."""
        self._bisect(first, pypto_pair)
        stretch = self._pointer_stretch(first)
        if stretch is not None:
            return self._across_stretch(first, *stretch)
        if first.found is None:
            if first.low_confidence is not None:
                self._partial.notes.append(_low_confidence_note(first, self.confidence))
            return self._partial
        culprit = first.candidates[first.found]
        parent = first.candidates[first.found - 1]
        outcome, change = self._culprit_outcome(first)
        if not change.moved or change.old is None or change.new is None:  # no range to bisect
            return outcome
        if first.descended:
            return self._descend(first, outcome, change)

        anchor = culprit
        if change.kind == "pointer-and-code":
            split = self._split(first, parent, culprit, change.old, change.new)
            outcome.split = split
            if split.carrier == "unknown":
                # Fixed repeats bisect simpler from a good end, and (culprit, old) did not build.
                outcome.source = "inconclusive"
                outcome.notes.append(_untold_halves(parent, culprit, change))
                return outcome
            if split.anchor is None:
                return outcome
            anchor = split.anchor
            if anchor == parent:
                outcome.notes.append(
                    f"simpler is bisected with pypto at the culprit's parent {parent[:12]}"
                )
        found = self._simpler_range(outcome, change)
        if found is None:
            return outcome
        states = found
        if anchor == culprit and change.kind == "pointer-only":
            self._check_runtime_read(parent, culprit, outcome)
        looked_into: str | None = None  # the merge whose line the last round added
        while True:
            second = self._simpler_level(
                states,
                anchor,
                prior=FlakePrior(evidence=evidence(first.observations, first.found)),
                plain=0,  # level one's boundary spent the allowance
            )
            outcome.simpler = second
            outcome.source = "simpler"
            if len(states) < 2:
                outcome.notes.append(
                    "the old and new simpler pointers have no commits between them"
                )
                return outcome
            self.events.level_started(
                "simpler",
                len(states) - 1,
                f"simpler states {outcome.direction} with pypto at {anchor[:12]}",
            )
            simpler_pair = lambda state: (anchor, state)  # noqa: E731
            self._load(second, simpler_pair)
            last = len(states) - 1
            if not second.observations.get(last):
                # (anchor, new) failed at the level above (culprit or pointer half): bad.
                second.observations[last] = [Verdict.BAD]
            if not self._good_end_holds(second, simpler_pair, first):
                outcome.source = "inconclusive"
                outcome.notes.append(
                    f"pypto {anchor[:12]} alone fails with the old simpler {states[0][:12]}: the "
                    "regression does not come from the simpler range (or the example is flaky)"
                )
                return outcome
            self._bisect(second, simpler_pair)
            if second.low_confidence is not None:
                outcome.notes.append(_low_confidence_note(second, self.confidence))
            line = self._merge_line(outcome)
            if line is None:
                self._merge_itself(outcome, looked_into)
                return outcome
            states, looked_into = self._with_line(outcome, states, line, anchor)

    def _culprit_outcome(self, first: LevelResult) -> tuple[Outcome, Change]:
        """The outcome blaming `first.found`, with what its change alone says about it (a move
        without both pointers, the runtime added or removed, has no simpler range)."""
        assert first.found is not None
        culprit = first.candidates[first.found]
        change = self.history.classify(culprit, self.path)
        outcome = Outcome("pypto", first, change=change)
        self._partial = outcome
        if not change.moved and not any(_builds_from(path) for path in change.changed_paths):
            outcome.notes.append(
                "the culprit changes no build input (only docs, tests or CI files), so its verdict "
                "may be noise: run `reproduce` on it and on its parent before trusting it"
            )
        if change.moved and (change.old is None or change.new is None):
            parent = first.candidates[first.found - 1]
            outcome.notes.append(submodule_note(self.history, parent, change, self.path))
        elif change.kind == "pointer-only":  # the pointer alone made it bad
            later = first.candidates[first.found + 1 :]
            undone = undone_later(later, self.gitlink, change.old)
            if undone is not None:
                outcome.notes.append(undone)
        return outcome, change

    def _descend(self, first: LevelResult, outcome: Outcome, change: Change) -> Outcome:
        """The joint descent into the bump level one stopped at. When the runs inside it move
        the boundary to another pointer move (level one descends before testing a bump itself,
        so of two bumps in a row it may pick the wrong one), descend into that one too: each
        bump once, with every run so far."""
        tried: list[int] = []
        while True:
            assert first.found is not None
            tried.append(first.found)
            self._moved_to = None
            outcome = self._joint(first, outcome, change)
            moved = self._moved_to
            if self._own_passed is not None:
                return outcome
            if moved is None:
                stretch = self._stretch_past(first)
                return outcome if stretch is None else self._across_stretch(first, *stretch)
            if moved in tried:
                outcome.notes.append(
                    f"the runs inside the bumps at {first.candidates[moved][:12]} and "
                    f"{first.candidates[tried[-1]][:12]} each point to the other: the example may "
                    "be flaky there; `reproduce` their runs before trusting either"
                )
                return outcome
            first.found = moved
            outcome, change = self._culprit_outcome(first)
            if change.old is None or change.new is None:
                return outcome

    def _stretch_past(self, first: LevelResult) -> tuple[int, Change, bool] | None:
        """`_pointer_stretch` for a descent that ended between untestable pairs and a later
        pypto commit: the bump's new pointer does not build, so the regression may have come
        with any bump up to that commit (level one descends before testing a bump itself, so
        two bumps in a row whose first pointer does not build end here, not inconclusive in
        level one). None, with level one left as it was, when the commits do not make one."""
        chain = self._chain
        if chain is None or chain.inconclusive is None or chain.pairs is None:
            return None
        assert first.found is not None
        commit = chain.pairs[chain.candidates[chain.inconclusive[1]]][0]
        end = first.candidates.index(commit)
        if end <= first.found:
            return None
        found = first.found
        first.found, first.inconclusive = None, (found, end)
        stretch = self._pointer_stretch(first)
        if stretch is None:
            first.found, first.inconclusive = found, None
        return stretch

    def _pointer_stretch(self, first: LevelResult) -> tuple[int, Change, bool] | None:
        """When untestable commits end the pypto level and the runtime pointer moves along one
        simpler path across them and the bad commit after them: where the stretch starts, the
        pointer move it makes as a whole (with pypto's code change, if any), and whether the
        untestable commits change pypto's code too (a bump whose own build fails, fixed by the
        next commit): then only a regression the pointer move carries can be pinned down."""
        if first.inconclusive is None:
            return None
        lo, hi = first.inconclusive
        commits = first.candidates[lo - 1 : hi + 1]
        changes = [self.history.classify(commit, self.path) for commit in commits[1:]]

        def builds(change: Change) -> bool:  # (not pointer moves, docs or a .gitmodules URL)
            paths = change.changed_paths
            return any(_builds_from(path) for path in paths if path not in METADATA_PATHS)

        untested_code = any(builds(change) for change in changes[:-1])
        old, new = self.gitlink(commits[0]), self.gitlink(commits[-1])
        if old is None or new is None or old == new:
            return None
        try:
            direction, states = self._states(old, new)
        except BisectError:
            return None
        if self._reaches(commits, states, direction) is None:
            return None  # the pointers do not walk one path: no single simpler range holds them
        coded = untested_code or builds(changes[-1])
        kind: ChangeKind = "pointer-and-code" if coded else "pointer-only"
        return (
            lo,
            replace(changes[-1], parent=commits[0], old=old, new=new, kind=kind),
            untested_code,
        )

    def _reaches(
        self, commits: Sequence[str], states: Sequence[str], direction: str
    ) -> list[int | None] | None:
        """How far along the simpler range ``states`` each commit's pointer reaches (the last
        state it holds), for a stretch of untestable bumps; None when the pointers do not walk
        the range in order, so no one range holds the stretch's moves.

        A pointer on the range reaches its own state. One that left the range forward, onto a
        line merged later (a bump to a feature branch that the next bump's merge brings in),
        reaches the last state that is its ancestor; one that holds none of the range's states
        (that line branched off before the old pointer), or a runtime removed for a commit and
        added back, reaches nothing (None): it cannot carry the range's regression, and it was
        never tested, so the states blame the first bump whose pointer does hold them."""
        reaches: list[int | None] = []
        for commit in commits:
            pointer = self.gitlink(commit)
            if pointer in states:
                reaches.append(states.index(pointer))
            elif pointer is None:
                reaches.append(None)
            elif direction != "forward" or self.merge_base is None:
                return None
            else:
                held = (j for j in reversed(range(len(states))) if self._holds(pointer, states[j]))
                reaches.append(next(held, None))
        walked = [r for r in reaches if r is not None]
        if walked != sorted(walked) or reaches[0] != 0:
            return None
        return reaches

    def _unread_before(self, first: LevelResult, lo: int) -> int | None:
        """The first commit of a stretch, before the bump it blames, whose simpler pointer no
        source holds: `_reaches` could not tell how far it reaches, so it may be the one that
        brought the simpler culprit."""
        if first.found is None or self.merge_base is None:
            return None
        for k in range(lo, first.found):
            pointer = self.gitlink(first.candidates[k])
            if pointer is not None and self.merge_base(pointer, pointer) is None:
                return k
        return None

    def _holds(self, pointer: str, state: str) -> bool:
        """Whether simpler commit ``state`` is in the history of ``pointer`` (asked of git once:
        a stretch's pointers are checked when it is found and again when its chain is made)."""
        assert self.merge_base is not None
        if (pointer, state) not in self._held:
            self._held[(pointer, state)] = self.merge_base(state, pointer) == state
        return self._held[(pointer, state)]

    def _across_stretch(
        self, first: LevelResult, lo: int, change: Change, untested_code: bool
    ) -> Outcome:
        """Bisect simpler across a stretch of bumps the pypto level could not judge (their new
        pointers, or their own code, do not build): their pairs are states of one simpler range.
        When the untested commits change pypto's code too, a regression that pypto's code
        carries stays the whole stretch: nothing tells which of its commits brought it."""
        assert first.inconclusive is not None
        hi = first.inconclusive[1]
        commits = first.candidates[lo : hi + 1]
        first.found, first.inconclusive = hi, None
        outcome = Outcome("pypto", first, change=change)
        self._partial = outcome
        assert change.old is not None and change.new is not None
        span = f"pypto {commits[0][:12]}..{commits[-1][:12]} could not be told apart (untested "
        if untested_code:
            outcome.notes.append(
                f"{span}commits before the first bad one, which between them change pypto's code "
                f"and move the {self.path} pointer): their combined move {change.old[:12]} -> "
                f"{change.new[:12]} is split as one bump with the code of {commits[-1][:12]}, the "
                "first of them that builds, and simpler is bisected across it"
            )
        else:
            outcome.notes.append(
                f"{span}commits before the first bad one), but each only moves the {self.path} "
                f"pointer: simpler is bisected across their combined move {change.old[:12]} -> "
                f"{change.new[:12]} with pypto's code, which they share"
            )
        try:
            outcome = self._joint(first, outcome, change, lo=lo, mixed=untested_code)
        except Pending:
            first.found = None  # still open: the chain's runs decide it (its posterior shows)
            raise
        kept = self._untested_code_kept(first, outcome, lo, hi) if untested_code else None
        if kept is not None:
            last, note = kept
            first.found, first.inconclusive = None, (lo, last)
            outcome.source, outcome.change, outcome.simpler = "inconclusive", None, None
            outcome.notes.append(note)
            return outcome
        unread = self._unread_before(first, lo)
        if unread is not None and outcome.source == "simpler" and first.found is not None:
            blamed = first.candidates[first.found]
            outcome.notes.append(
                f"pypto {first.candidates[unread][:12]} pins simpler "
                f"{(self.gitlink(first.candidates[unread]) or '')[:12]}, which no source given "
                f"holds, so it may already have brought the simpler culprit: the pypto commit "
                f"to blame is one of {first.candidates[unread][:12]}..{blamed[:12]} (give "
                "--simpler a clone that has it to tell)"
            )
            first.found, first.inconclusive = None, (unread, first.found)
            outcome.change, outcome.split = None, None
            return outcome
        blamed = first.first_bad
        # The blamed bump's own move; none when the answer is one of several bumps.
        outcome.change = None if blamed is None else self.history.classify(blamed, self.path)
        if blamed != commits[-1]:
            outcome.split = None  # the last bump's halves: not the blamed commit's
        if blamed is not None and blamed != commits[-1] and outcome.source == "simpler":
            outcome.notes.append(
                f"pypto {blamed[:12]} is blamed without a passing or failing run of its own: its "
                "pointer move is the first of them to cross the simpler culprit"
            )
        return outcome

    def _untested_code_kept(
        self, first: LevelResult, outcome: Outcome, lo: int, hi: int
    ) -> tuple[int, str] | None:
        """How far a stretch whose untested commits change pypto's code stays open, and why; None
        when the joint chain's answer stands. Up to its end when pypto's code carries the
        regression (the untested code is part of that code); up to the blamed bump when the move
        carries it but the untested commits before that bump were never built with the old
        pointer (the code half did not pass), so any of them may be bad on its own."""
        found = first.found
        if outcome.source == "pypto" and found == hi:
            return hi, (
                f"pypto's code carries the regression, and {hi - lo} untested commit(s) before "
                f"{first.candidates[hi][:12]} change that code too: the first bad one is any of "
                "them"
            )
        covered = outcome.split is not None and outcome.split.code_half is Verdict.GOOD
        if outcome.source == "simpler" and found is not None and found > lo and not covered:
            culprit = outcome.simpler_culprit or "?"
            anchor = (outcome.simpler.anchor if outcome.simpler else None) or "?"
            return found, (
                f"the pointer move carries a regression (simpler {culprit[:12]} with pypto at "
                f"{anchor[:12]}), but the untested commits before {first.candidates[found][:12]} "
                "change pypto's code and were never built with the old pointer: the first bad one "
                "is any of them"
            )
        return None

    def _seen_elsewhere(self, first: LevelResult) -> tuple[int, int, int, int] | None:
        """The bisect's runs judged by its answer: what they say about the flake rates."""
        if self._chain is not None and self._chain.found is not None:
            return evidence(self._chain.observations, self._chain.found)
        if first.found is None:
            return None
        return evidence(first.observations, first.found)

    def _joint(
        self,
        first: LevelResult,
        outcome: Outcome,
        change: Change,
        lo: int | None = None,
        mixed: bool = False,
    ) -> Outcome:
        """Bisect inside the culprit's pointer move and check both levels' boundaries at once.

        The pairs form one chain from the known-good end to the known-bad end: level one's
        commits up to the parent, the pairs inside the bump (the code half first when the bump
        changes code too), then the culprit and the commits after it. The first bad pair of that
        chain is the answer, so one posterior over it is the joint probability that the pypto
        culprit and the simpler culprit are both right, every run of both levels is evidence for
        it, and the reproduction check applies to the final boundary only. Pairs with the same
        build inputs are one link: a pointer-only bump's culprit with the old pointer builds
        exactly what its parent built. Each pypto commit keeps its prior share; a bump's share
        is spread over the pairs inside it.

        `lo`: a stretch of bumps ``lo..found`` taken as one move (see `_across_stretch`); each
        state inside it blames the first bump whose pointer reaches it. `mixed`: the stretch's
        untested commits change pypto's code too, so its parent is the commit before it.
        """
        assert first.found is not None and change.old is not None and change.new is not None
        c = first.found
        lo = c if lo is None else lo
        parent, culprit = first.candidates[(lo if mixed else c) - 1], first.candidates[c]
        anchor: str | None = culprit
        if change.kind == "pointer-and-code":
            split = self._split(first, parent, culprit, change.old, change.new)
            outcome.split = split
            anchor = split.anchor
            if anchor == parent:
                outcome.notes.append(
                    f"simpler is bisected with pypto at the culprit's parent {parent[:12]}"
                )
        states: list[str] = []
        if anchor is not None:
            found = self._simpler_range(outcome, change)
            if found is None:
                return outcome
            states = found
        if anchor == culprit and change.kind == "pointer-only":
            self._check_runtime_read(first.candidates[lo - 1], culprit, outcome)
        looked_into: str | None = None  # the merge whose line the last round added
        while True:
            outcome = self._joint_states(first, outcome, change, lo, mixed, anchor, states)
            if self._own_passed is not None:
                return outcome
            line = self._merge_line(outcome)
            if line is None:
                self._merge_itself(outcome, looked_into)
                return outcome
            states, looked_into = self._with_line(outcome, states, line, anchor)
            first.found = c  # (a stretch's answer moved it to the bump that reached the state)

    def _simpler_level(
        self,
        states: list[str],
        anchor: str,
        prior: FlakePrior | None = None,
        plain: int | None = None,
    ) -> LevelResult:
        """A second level over `states` with pypto at `anchor`, as this session runs levels."""
        return LevelResult(
            "simpler",
            states,
            anchor=anchor,
            repeat=self.repeat,
            policy=self.policy,
            prior=prior,
            plain=plain,
            good_runs=self._last_good_runs,
        )

    def _with_line(
        self, outcome: Outcome, states: Sequence[str], line: Sequence[str], anchor: str | None
    ) -> tuple[list[str], str]:
        """The states with the line of the merge found first bad before it (see `_line`), and
        that merge; a note says why."""
        assert outcome.simpler is not None and outcome.simpler.found is not None
        j = outcome.simpler.found
        backward = outcome._backward_step(j)
        merge = states[j - 1] if backward else states[j]
        subject = self.simpler_subject(merge) if self.simpler_subject else ""
        outcome.notes.append(
            f"the simpler states put the regression at {'the removal of ' if backward else ''}"
            f"merge {merge[:12]}{f' ({subject})' if subject else ''}; the "
            f"{counted(len(line), 'commit')} it brings from its other parent "
            f"{'was' if len(line) == 1 else 'were'} bisected too, with pypto at "
            f"{(anchor or '')[:12]}"
        )
        if backward:
            # Dropped newest first, down to where the line starts on the parent's side. When the
            # line's states pass down to there and the parent fails, no commit of the line is to
            # blame on its own: the merge is (`Outcome.dropped_merges`).
            base = self.merge_base(line[0], states[j]) if self.merge_base else None
            tail = [base] if base is not None and base not in (*states, *line) else []
            if tail:
                outcome.dropped_merges[tail[0]] = merge
            return [*states[:j], *reversed(line), *tail, *states[j:]], merge
        return [*states[:j], *line, *states[j:]], merge

    @staticmethod
    def _merge_itself(outcome: Outcome, looked_into: str | None) -> None:
        """Say so when the merge whose line was bisected stays the answer."""
        if looked_into is not None and outcome.simpler_culprit == looked_into:
            if outcome.direction == "backward":
                outcome.notes.append(
                    f"no commit merge {looked_into[:12]} brings shows, dropped one by one, where "
                    "the regression came back: dropping the merge as a whole brought it back"
                )
                return
            outcome.notes.append(
                f"every commit merge {looked_into[:12]} brings passes on its own: the merge "
                "itself (what it combines, or how it resolved a conflict) carries the regression"
            )

    def _check_runtime_read(self, parent: str, culprit: str, outcome: Outcome) -> None:
        """Whether pypto's build reads the runtime's files where its build files do not show it
        (a symlink into the submodule, a script that copies from it): pypto's own files are the
        same at `culprit` as at `parent` (only the pointer moved), yet their pypto wheels, as
        the runs recorded them, differ. Then each simpler state must be tested with pypto
        rebuilt against it, or the states would all carry the new pointer's files; the tester
        is told, and a note says so."""
        if self.reads_runtime is None or self.reads_runtime(culprit):
            return  # (its build files show it: the states are built that way already)
        digests = [
            {
                a.wheel_contents["pypto"]
                for a in self.lookup(commit, self.gitlink(commit))
                if "pypto" in a.wheel_contents
            }
            for commit in (parent, culprit)
        ]
        if not all(digests) or digests[0] & digests[1]:
            return
        outcome.notes.append(
            f"pypto's wheel at {culprit[:12]} differs from the one at {parent[:12]} though only "
            f"the {self.path} pointer moved between them: its build reads the runtime's files "
            "(its build files do not show how: a symlink, or a script that copies them), so each "
            "simpler state is tested with pypto rebuilt against it"
        )
        tell = getattr(self.tester, "reads_runtime", None)
        if tell is not None:
            tell(culprit)

    def _merge_line(self, outcome: Outcome) -> list[str] | None:
        """The line of the simpler state found first bad (see `_line`), if any."""
        level = outcome.simpler
        if level is None or level.found is None:
            return None
        return self._line(outcome, level.candidates, level.found)

    def _line(self, outcome: Outcome, states: Sequence[str], j: int) -> list[str] | None:
        """What state `j`, a merge the search reaches through the state before it, brings from
        its other parent: its commits oldest first, along that parent's first parents. Once
        the search puts the regression at such a merge, they are bisected too, to name the
        commit that did it rather than the merge. Going backward, state `j` is the merge's
        parent and the merge the state before it, whose removal brought the regression: what it
        drops is bisected the same way (not across a merge base, where a diverged move turns).
        None for a state that is no such merge, or one whose line is among the states already."""
        if self.merged_line is None or not 0 < j < len(states):
            return None
        key = (states[j], states[j - 1])
        held = states[0]  # what the move keeps: not brought by it, whatever a merge says
        if outcome._backward_step(j):
            if outcome.direction != "backward":
                return None
            key, held = (states[j - 1], states[j]), states[-1]
        if key not in self._lines:
            self._lines[key] = self.merged_line(*key)
        line = self._lines[key]
        if self.merge_base is not None:  # (a merge on a line: reached from a line state)
            line = [commit for commit in line if not self._holds(held, commit)]
        if not line or not set(states).isdisjoint(line):
            return None
        return line

    def _joint_states(
        self,
        first: LevelResult,
        outcome: Outcome,
        change: Change,
        lo: int,
        mixed: bool,
        anchor: str | None,
        states: list[str],
    ) -> Outcome:
        """`_joint` over these simpler states."""
        assert first.found is not None
        c = first.found
        built = self._joint_chain(first, c, lo, change, anchor, states, outcome.split, mixed)
        chain, links, origin, at_state = built.result, built.links, built.origin, built.at_state
        # A merge state with a line to bisect is descended into as soon as the runs point at
        # it (its boundary is checked at the end of its line, as a bump's is inside the bump).
        chain.descend = frozenset(
            k for k, j in at_state.items() if self._line(outcome, states, j) is not None
        )
        self._chain = chain
        second = None
        if anchor is not None:
            second = self._simpler_level(states, anchor)
            outcome.simpler = second
            outcome.source = "simpler"
            self.events.level_started(
                "simpler",
                len(states) - 1,
                f"simpler states {outcome.direction} with pypto at {anchor[:12]}, checked with "
                "the pypto level's runs",
            )
        for k, pairs in enumerate(links):
            for pair in dict.fromkeys(pairs):
                seen = self._recorded("simpler", *pair)
                if seen:  # (with fixed repeats, a commit with an entry is one short of runs)
                    self._count(chain, k, seen)
        held = (
            a for pair in {pair for pairs in links for pair in pairs} for a in self.lookup(*pair)
        )
        self._reused("simpler", held, level="simpler")  # (the pypto level counted its own)
        try:
            self._bisect(chain, self._pair(chain))
            own = self._own_link_unseen(chain, first, links, origin, c, lo)
            if own is not None:
                self._steps(chain, self._pair(chain), [own])
                if chain.observations[own][-1] is Verdict.GOOD:
                    self._own_passed = c
                    return outcome
                chain.found = None
                self._bisect(chain, self._pair(chain))
        finally:
            self._project(chain, first, second, origin, at_state)
        return self._joint_outcome(chain, first, second, outcome, origin, at_state, links)

    def _own_link_unseen(
        self,
        chain: LevelResult,
        first: LevelResult,
        links: Sequence[Sequence[tuple[str, str | None]]],
        origin: Sequence[int],
        c: int,
        lo: int,
    ) -> int | None:
        """The link of the bump's own pair (the culprit with its own pointer) when the chain
        blames a state inside the bump and that pair has never run; else None.

        Level one descends into a bump before testing the bump itself, and the chain takes the
        states inside it to lead up to its new pointer. A simpler range can hold a regression and
        its fix, though: the states inside fail and the bump's own pair passes. Plain bisection
        tests the bump's commit in level one and goes past it; so must the chain before it names
        that commit (a stretch's bumps in between do not build, so only its last is its own)."""
        k = chain.found
        if k is None or lo != c or origin[k] != c:
            return None
        culprit = first.candidates[c]
        own = next(i for i, pairs in enumerate(links) if (culprit, self.gitlink(culprit)) in pairs)
        if k >= own or chain.observations.get(own):
            return None
        return own

    def _joint_chain(
        self,
        first: LevelResult,
        c: int,
        lo: int,
        change: Change,
        anchor: str | None,
        states: Sequence[str],
        split: Split | None,
        mixed: bool = False,
    ) -> _Chain:
        """The joint chain of `_joint` for the bump at `c` (``lo..c`` for a stretch, `mixed`
        when its untested commits change code too), its runs not counted yet."""
        parent, culprit = first.candidates[(lo if mixed else c) - 1], first.candidates[c]
        assert change.old is not None
        links: list[list[tuple[str, str | None]]] = [
            [(commit, self.gitlink(commit))] for commit in first.candidates[:lo]
        ]
        origin: list[int] = list(range(lo))  # the pypto candidate each link's hypothesis blames
        at_state: dict[int, int] = {}  # link -> simpler state index
        # A stretch's bumps by the state each one's pointer names (`_pointer_stretch` checked
        # they walk the range in order): a state inside blames the first bump that reaches it,
        # unless only the last bump's code with the new pointer fails (an interaction).
        reach: dict[int, int] = {}  # state index -> the earliest bump whose pointer reaches it
        named: dict[int, int] = {}  # state index -> the earliest bump whose pointer is that state
        if lo < c and states and not (split is not None and split.carrier == "interaction"):
            assert change.new is not None
            direction = self._states(change.old, change.new)[0]
            # (the stretch's parent first; `_pointer_stretch` checked that they walk the range)
            reaches = self._reaches(first.candidates[lo - 1 : c], states, direction)
            assert reaches is not None
            # (from the last down: the earliest commit reaching a state keeps it)
            for k in range(c - 1, lo - 1, -1):
                position = reaches[k - lo + 1]
                if position is None:
                    continue
                reach[position] = k
                if self.gitlink(first.candidates[k]) == states[position]:
                    named[position] = k
        owner = lambda j: min((k for p, k in reach.items() if p >= j), default=c)  # noqa: E731
        # Their own runs are the anchor's when it has their code (not the last bump's new code).
        same_code = not mixed and (change.kind == "pointer-only" or anchor == parent)
        if anchor is None:
            if split is not None and split.code_half is not Verdict.SKIP:
                links.append([(culprit, change.old)])
                origin.append(c)
        else:
            inside = states[1:-1]
            if anchor == culprit and change.kind == "pointer-only":
                at_state[lo - 1] = 0
                links[lo - 1].append((culprit, states[0]))
            elif anchor == culprit:
                at_state[len(links)] = 0
                links.append([(culprit, states[0])])
                origin.append(c)
            for j, state in enumerate(inside, start=1):
                at_state[len(links)] = j
                links.append([(anchor, state)])
                if j in named and same_code:  # a bump of the stretch names this state
                    links[-1].append((first.candidates[named[j]], state))
                origin.append(owner(j))
            if anchor == parent:
                at_state[lo - 1] = 0
                at_state[len(links)] = len(states) - 1
                links.append([(parent, states[-1])])
                origin.append(c)
            else:
                at_state[len(links)] = len(states) - 1
        end = len(links)  # the culprit's link closes the bump's share
        for commit in first.candidates[c:]:
            links.append([(commit, self.gitlink(commit))])
        origin += list(range(c, len(first.candidates)))
        if states and anchor != parent:
            # The culprit's own link is the move's last state: the first bump of a stretch that
            # reaches it is blamed for it, as for the states inside (else the culprit).
            origin[end] = owner(len(states) - 1)
        shares = {k: origin[lo : end + 1].count(k) for k in range(lo, c + 1)}
        weights = tuple(1 / shares[origin[k]] if lo <= k <= end else 1.0 for k in range(len(links)))
        labels = [f"{k}:{pairs[0][0]}:{pairs[0][1]}" for k, pairs in enumerate(links)]
        # Plain bisection of both levels at worst: the endpoints and ceil(log2) steps per level.
        # Not its second level's good end or the split's halves: plain bisection runs them, but
        # a plain run is often a step or two short of its worst case, and a default session
        # should stay within 3 tests of the plain run of the same history too.
        plain = 2 + bisection_steps(len(first.candidates)) + bisection_steps(len(states))
        result = LevelResult(
            "simpler",
            labels,
            anchor=anchor,
            weights=weights,
            pairs={label: pairs[0] for label, pairs in zip(labels, links, strict=True)},
            plain=plain,
            good_runs=self._last_good_runs,
        )
        return _Chain(result, links, origin, at_state)

    def _project(
        self,
        chain: LevelResult,
        first: LevelResult,
        second: LevelResult | None,
        origin: Sequence[int],
        at_state: Mapping[int, int],
    ) -> None:
        """Each level's view of the joint chain: its runs, tests and posterior (none with fixed
        repeats, which judge by their policy, not by a model).

        The chain records its runs of pypto commits with their own pointers as simpler-stage
        attempts; they are runs of the first level's pairs all the same, so its counts (the
        report's, `status`'s) take every run of each pair, whichever stage recorded it."""
        for index, commit in enumerate(first.candidates):
            seen = self._recorded("simpler", commit, self.gitlink(commit), used=False)
            if len(seen) > len(first.observations.get(index, [])):
                first.observations[index] = [self.verdict(a) for a in seen]
                first.runs[index] = [a.run_id for a in seen]
        if second is None:
            first.tests += chain.tests
            first.rounds += chain.rounds
        else:
            second.tests, second.rounds = chain.tests, chain.rounds
            second.observations = {
                j: list(chain.observations[k])
                for k, j in at_state.items()
                if chain.observations.get(k)
            }
            second.runs = {j: list(chain.runs[k]) for k, j in at_state.items() if k in chain.runs}
        if self.repeat is not None:
            return
        if chain.belief is None:
            chain.belief = belief(
                len(chain.candidates), chain.observations, chain.prior, chain.weights
            )
        joint = chain.belief
        pypto = [0.0] * len(first.candidates)
        for k, p in enumerate(joint.probabilities):
            if k > 0:
                pypto[origin[k]] += p
        first.belief = _projected(joint, pypto, first.observations)
        if second is None:
            return
        simpler = [0.0] * len(second.candidates)
        for k, j in at_state.items():
            if j > 0:
                simpler[j] = joint.probabilities[k]
        second.belief = _projected(joint, simpler, second.observations)

    def _joint_outcome(
        self,
        chain: LevelResult,
        first: LevelResult,
        second: LevelResult | None,
        outcome: Outcome,
        origin: Sequence[int],
        at_state: Mapping[int, int],
        links: Sequence[Sequence[tuple[str, str | None]]],
    ) -> Outcome:
        c = first.found
        assert c is not None
        if chain.found is not None:
            k = chain.found
            self._last_good = links[k - 1][0]
            if second is not None and at_state.get(k, 0) > 0:
                second.found = at_state[k]
                first.found = origin[k]  # a stretch's bump that reaches the state (else c)
                return outcome
            if origin[k] == c:
                # the code half or pypto's code on top of the new pointer fails: the code carries it
                outcome.source, outcome.simpler = "pypto", None
                if outcome.split is not None:
                    outcome.split.carrier = "code"
                    outcome.split.anchor = None
                return outcome
            # The runs of both levels moved the boundary off the bump: a plain pypto culprit,
            # or another pointer move, which `_descend` takes next.
            moved = first.candidates[origin[k]]
            first.found = origin[k]
            change = self.history.classify(moved, self.path)
            if change.moved:
                self._moved_to = origin[k]
            outcome.change, outcome.split, outcome.simpler = change, None, None
            outcome.direction = None
            outcome.source = "pypto"
            if change.moved:
                outcome.source = "inconclusive"
                outcome.notes.append(
                    f"the runs inside the bump at {first.candidates[c][:12]} point to another "
                    f"pointer move, {moved[:12]}"
                )
            else:
                outcome.notes.append(
                    f"simpler was bisected inside the bump at {first.candidates[c][:12]} too; "
                    f"every run of both levels puts the first bad commit at {moved[:12]}, which "
                    "moves no pointer"
                )
            return outcome
        if chain.inconclusive is not None:
            lo, hi = chain.inconclusive
            self._last_good = links[lo - 1][0]
            if second is not None and all(at_state.get(k, 0) > 0 for k in range(lo, hi + 1)):
                second.inconclusive = (at_state[lo], at_state[hi])
                if origin[lo] != origin[hi]:  # the states span bumps of a stretch
                    first.found, first.inconclusive = None, (origin[lo], origin[hi])
                    pairs = ", ".join(
                        f"{second.candidates[at_state[k]][:12]} -> "
                        f"{first.candidates[origin[k]][:12]}"
                        for k in range(lo, hi + 1)
                    )
                    outcome.notes.append(
                        "the pypto bump to blame depends on the simpler candidate (each bump "
                        f"takes in the states up to its new pointer): {pairs}"
                    )
                return outcome
            outcome.source = "inconclusive"
            # Simpler states inside the stretch (after the bump's own code with the old pointer,
            # which did not build): the simpler candidates, beside that code.
            inside = [at_state[k] for k in range(lo, hi + 1) if at_state.get(k, 0) > 0]
            if second is not None and inside and at_state.get(hi, 0) > 0:
                second.inconclusive = (inside[0], at_state[hi])
            outcome.notes.append(
                "untestable pairs around the boundary: "
                + ", ".join(
                    f"{links[k][0][0][:12]} with simpler {(links[k][0][1] or 'none')[:12]}"
                    for k in range(lo - 1, hi + 1)
                )
            )
            return outcome
        if chain.low_confidence is not None:
            listed = ", ".join(
                f"{links[k][0][0][:12]} with simpler {(links[k][0][1] or 'none')[:12]} {p:.0%}"
                for k, p in chain.low_confidence
            )
            top = chain.low_confidence[0][1] if chain.low_confidence else 0.0
            outcome.notes.append(
                f"inconclusive: low confidence after {chain.tests} tests of both levels; "
                f"first bad pair candidates: {listed}{why_low(top, self.confidence)}"
            )
            if second is not None:
                second.low_confidence = tuple(
                    (at_state[k], p) for k, p in chain.low_confidence if at_state.get(k, 0) > 0
                )
            else:
                outcome.source = "inconclusive"
        return outcome

    def _states(self, old: str, new: str) -> tuple[str, list[str]]:
        """`simpler_states`, asked once per pointer move (a failure is kept too)."""
        known = self._ranges.get((old, new))
        if known is None:
            try:
                known = self.simpler_states(old, new)
            except BisectError as exc:
                known = exc
            self._ranges[(old, new)] = known
        if isinstance(known, BisectError):
            raise known
        return known

    def _range_readable(self, commit: str) -> bool:
        """Whether a second level could bisect inside this pointer move."""
        change = self.history.classify(commit, self.path)
        if change.old is None or change.new is None:
            return True
        try:
            self._states(change.old, change.new)
        except BisectError:
            return False
        return True

    def _simpler_range(self, outcome: Outcome, change: Change) -> list[str] | None:
        """The simpler states between the bump's pointers (direction and merge base noted on
        the outcome); None, with the reason noted, when they cannot be read."""
        assert change.old is not None and change.new is not None
        try:
            direction, states = self._states(change.old, change.new)
        except BisectError as exc:
            # The pypto culprit stands; only the descent is impossible (objects missing locally).
            outcome.source = "inconclusive"
            outcome.notes.append(f"the simpler range cannot be bisected: {exc}")
            return None
        outcome.direction = direction
        if direction == "diverged" and self.merge_base is not None:
            base = self.merge_base(change.old, change.new)
            if base in states:
                outcome.merge_base_index = states.index(base)
        return states

    def _drift_midway(self, result: LevelResult) -> None:
        """Stop with drift when the environment went bad during the search, not at its end.

        What that looks like: the level's last `DRIFT_STREAK` runs all failed, one of them a
        commit that had passed `REPLICATE` times before (the level's good end: once) and that
        the runs before them put on the good side. A flaky example does that now and then too,
        so it only makes the session re-run the known-good commit until it passes; when it
        fails `DRIFT_RUNS` times in a row, the session stops (exit 3) rather than read every
        failure as flakiness until its budget runs out. A function of the recorded runs, so a
        resumed session decides the same."""
        if not (self.drift_check and self.verify) or self.repeat is not None:
            return
        timeline = sorted(result.timeline, key=lambda run: run[:2])
        streak = timeline[-DRIFT_STREAK:]
        if len(streak) < DRIFT_STREAK or any(v is not Verdict.BAD for *_, v in streak):
            return
        before: dict[int, list[Verdict]] = {}
        for *_, j, v in timeline[:-DRIFT_STREAK]:
            before.setdefault(j, []).append(v)
        # A commit the runs before the streak put on the good side: a bad one that once passed
        # (a lie) failing again is what a flaky example does every session.
        then = belief(len(result.candidates), before, result.prior, result.weights)
        if not any(
            before.get(index, []).count(Verdict.GOOD) >= (1 if index == 0 else REPLICATE)
            and sum(then.probabilities[index + 1 :]) >= 0.5
            for _, _, index, _ in streak
        ):
            return
        since = streak[-1][:2]
        known = (self.good, self.gitlink(self.good))
        seen = self._drift_verdicts(known, after=since)
        # One pass clears the environment; a flaky example's known-good commit fails that
        # often in a row about never, a broken environment always.
        run = self._runs_of("drift", [known], [seen])
        while Verdict.GOOD not in seen and len(seen) < DRIFT_RUNS:
            run([0])
        if Verdict.GOOD not in seen:
            raise _Drifted(
                f"the known-good commit {self.good[:12]}",
                f"the {result.level} level's last {DRIFT_STREAK} runs failed, one of them a "
                f"commit that had passed before, and the known-good commit failed {DRIFT_RUNS} "
                "times in a row then: the environment changed during the search, so it stopped "
                "there",
            )

    def _drift_verdicts(
        self, pair: tuple[str, str | None], after: tuple[datetime, str]
    ) -> list[Verdict]:
        """The verdicts of the pair's drift checks that finished after `after` (a run's
        (finished at, run id)): the earlier ones checked the environment of another moment."""
        return [self.verdict(a) for a in self._drift_attempts(pair, after)]

    def _drift_attempts(
        self, pair: tuple[str, str | None], after: tuple[datetime, str]
    ) -> list[Attempt]:
        return [
            a
            for a in self.lookup(*pair)
            if a.level == "drift" and (a.finished_at, a.run_id) > after
        ]

    def _check_drift(self, outcome: Outcome, first: LevelResult) -> None:
        """Check that good commits still pass at the end: bad now = the environment drifted
        during the session, and no culprit found in it can be trusted.

        The confidence search runs the last good commit last, one time more than the boundary
        needs (`_last_good_runs`): when that run is among the bisect's last three attempts and
        passed, it saw the environment as it is now and nothing is re-run. Otherwise (and with
        fixed repeats) the known-good endpoint is re-run, and the last good commit too unless it
        ran that recently.
        """
        known = ("known-good", self.good, self.gitlink(self.good))
        pairs = [known]
        second = outcome.simpler
        if self._last_good is not None:
            last = self._last_good
        elif second is not None and second.found is not None and second.anchor is not None:
            last = (second.anchor, second.candidates[second.found - 1])
        else:
            parent = first.candidates[first.found - 1] if first.found else self.good
            last = (parent, self.gitlink(parent))
        latest = sorted(set(self._times))[-3:]
        recent = [
            self.verdict(a)
            for a in self.lookup(*last)
            if a.level != "drift" and latest and a.finished_at >= latest[0]
        ]
        if self.repeat is None and last != known[1:] and Verdict.GOOD in recent:
            pairs = []
        elif last != known[1:] and not recent:
            pairs.append(("last good", *last))
        ran = [self._drift_attempts(pair[1:], after=self._last_search) for pair in pairs]
        seen = [[self.verdict(a) for a in attempts] for attempts in ran]
        self._reused("drift check", (a for attempts in ran for a in attempts))
        verdicts = self._judge_pairs(
            "drift", [p[1:] for p in pairs], seen, first, prior_bad=EXPECTED_GOOD
        )
        for (_name, *pair), runs in zip(pairs, seen, strict=True):
            placed = self._placed(outcome, first, (pair[0], pair[1]))
            if placed is not None and runs:
                placed[0].checks.setdefault(placed[1], []).extend(runs)
        for (name, pypto, simpler), verdict in zip(pairs, verdicts, strict=True):
            if verdict is not Verdict.BAD:
                continue
            ran = self._drift_verdicts((pypto, simpler), after=self._last_search)
            if Verdict.GOOD in ran:
                judge = (
                    f"--policy {self.policy} judged it bad"
                    if self.repeat is not None
                    else "the flake rates the session learnt judge it bad"
                )
                outcome.notes.append(
                    f"the {name} commit's runs at the end disagree ({ran.count(Verdict.BAD)} "
                    f"failed, {ran.count(Verdict.GOOD)} passed) and {judge}: a flaky example "
                    "can look like drift; `reproduce` it before trusting either"
                )
            if simpler == self.gitlink(pypto):
                outcome.drift.append(f"the {name} commit {pypto[:12]}")
            else:  # a simpler state inside a bump, run with the pypto commit its level pins
                outcome.drift.append(
                    f"the {name} simpler commit {str(simpler)[:12]} with pypto {pypto[:12]}"
                )

    @staticmethod
    def _placed(
        outcome: Outcome, first: LevelResult, pair: tuple[str, str | None]
    ) -> tuple[LevelResult, int] | None:
        """The level and candidate a pair was tested as: a state of the simpler level with
        its anchor, else a commit of the first level with the simpler it ran with."""
        second = outcome.simpler
        if second is not None and pair[0] == second.anchor and pair[1] in second.candidates:
            return second, second.candidates.index(pair[1])
        if pair[0] in first.candidates:
            return first, first.candidates.index(pair[0])
        return None

    def _judge_pairs(
        self,
        level: Level,
        pairs: Sequence[tuple[str, str | None]],
        seen: list[list[Verdict]],
        first: LevelResult,
        prior_bad: float = 0.5,
    ) -> list[Verdict]:
        """Run each pair until its runs give a verdict (split halves, drift re-runs)."""

        def verdict(i: int) -> Verdict | None:
            if self.repeat is not None:
                if len(seen[i]) < self.repeat:
                    return None
                return aggregate(seen[i], self.policy) or Verdict.SKIP
            # Without an answer the learnt rates may be the drift itself (every run failing
            # looks like a very flaky example): judge by the prior's rates instead.
            rates = first.belief if first.found is not None else None
            return pair_verdict(
                seen[i],
                false_fail=rates.false_fail if rates else 0.05,
                false_pass=rates.false_pass if rates else 0.05,
                confidence=self.confidence,
                prior_bad=prior_bad,
                seen_elsewhere=self._seen_elsewhere(first),
            )

        run = self._runs_of(level, pairs, seen)
        self._until_settled(
            len(pairs),
            lambda i: verdict(i) is not None,
            run,
            lambda i: True,
            lacking=None if self.repeat is None else lambda i: self.repeat - len(seen[i]),
        )
        out = []
        for i in range(len(pairs)):
            v = verdict(i)
            assert v is not None
            out.append(v)
        return out

    def _runs_of(
        self, level: Level, pairs: Sequence[tuple[str, str | None]], seen: list[list[Verdict]]
    ) -> Callable[[Sequence[int]], None]:
        """Runs a round of the picked pairs, adding each verdict to its pair's list."""

        def run(picks: Sequence[int]) -> None:
            requests = [Request(level, *pairs[i]) for i in picks]
            checks = [_again(len(seen[i]) + picks[:n].count(i)) for n, i in enumerate(picks)]
            for i, attempt in zip(picks, self._run_round(requests, checks), strict=True):
                seen[i].append(self.verdict(attempt))

        return run

    def _until_settled(
        self,
        count: int,
        settled: Callable[[int], bool],
        run: Callable[[Sequence[int]], None],
        go_on: Callable[[int], bool],
        lacking: Callable[[int], int] | None = None,
    ) -> None:
        """Run items ``0..count-1`` again until each is settled; ``go_on(i)`` once item i is
        settled says whether the others are still wanted.

        One device: one item after the other, as before. Several: every unsettled item in one
        round, and the spare devices repeat items that already needed a repeat, so a flaky pair
        gets its runs at once. With fixed repeats, ``lacking(i)`` is how many runs item i still
        lacks: the spare devices take those at once, and never one more (`--repeat N` is N runs
        of every tested commit, which a policy such as majority counts).
        """
        if self.parallel == 1:
            for i in range(count):
                while not settled(i):
                    run([i])
                if not go_on(i):
                    return
            return
        reported: set[int] = set()
        ran: set[int] = set()
        while True:
            for i in range(count):
                if i not in reported and settled(i):
                    reported.add(i)
                    if not go_on(i):
                        return
            open_ = [i for i in range(count) if i not in reported]
            if not open_:
                return
            picks = list(open_)
            if lacking is not None:
                more = [i for i in open_ for _ in range(lacking(i) - 1)]
                picks += more[: max(0, self.parallel - len(picks))]
            else:
                again = [i for i in open_ if i in ran]
                while again and len(picks) < self.parallel:
                    picks.append(again[len(picks) % len(again)])
            ran.update(open_)
            run(picks)

    def _good_end_holds(
        self,
        second: LevelResult,
        pair: Callable[[str], tuple[str, str | None]],
        first: LevelResult,
    ) -> bool:
        """Test (anchor, old pointer) unless some level already judged exactly that pair.

        A pointer-only bump's culprit was never run with the old runtime: assuming it passes
        would blame a simpler commit for what the pypto commit does on its own.
        """
        while True:
            seen = second.observations.get(0, [])
            if self.repeat is not None:
                verdict = aggregate(seen, self.policy) if len(seen) >= self.repeat else None
                if verdict is not None:
                    return verdict is Verdict.GOOD
            else:
                rates = first.belief
                state = (
                    endpoint_check(seen, Verdict.GOOD)
                    if rates is None
                    else _pair_state(seen, Verdict.GOOD, rates, self.confidence)
                )
                if state != "again":
                    return state == "confirmed"
            self._step(second, pair, 0)

    def _verify_endpoints(
        self, first: LevelResult, pair: Callable[[str], tuple[str, str | None]]
    ) -> None:
        last = len(first.candidates) - 1
        ends = ((0, Verdict.GOOD, "good"), (last, Verdict.BAD, "bad"))

        def state(i: int) -> bool | None:
            index, expected, _ = ends[i]
            seen = first.observations.get(index, [])
            if self.repeat is not None:
                verdict = aggregate(seen, self.policy) if len(seen) >= self.repeat else None
                return None if verdict is None else verdict is expected
            check = endpoint_check(seen, expected)
            return None if check == "again" else check == "confirmed"

        def holds(i: int) -> bool:
            if state(i) is False:
                commit = first.candidates[ends[i][0]]
                recorded = self.lookup(commit, self.gitlink(commit))
                raise EndpointFailure(ends[i][2], judged(recorded[-1], self.tolerance))
            return True

        def run(picks: Sequence[int]) -> None:
            tested = [ends[i][0] for i in picks]
            # With one device the other endpoint follows: it is built ahead first.
            due = [i for i in range(len(ends)) if i not in picks and state(i) is None]
            # The endpoints usually hold: build the first bisect round ahead meanwhile.
            assumed = {i: list(v) for i, v in first.observations.items()}
            for i in [*picks, *due]:
                assumed.setdefault(ends[i][0], []).append(ends[i][1])
            with contextlib.suppress(ValueError):
                step = self._picks(first, assumed)
                following = step.indices if isinstance(step, Test) else ()
                certain = [ends[i][0] for i in due]
                self._prefetch(first, following, assumed, testing=tested, certain=certain)
            self._steps(first, pair, tested)

        def lacking(i: int) -> int:
            assert self.repeat is not None
            return self.repeat - len(first.observations.get(ends[i][0], []))

        self._until_settled(
            len(ends),
            lambda i: state(i) is not None,
            run,
            holds,
            lacking=None if self.repeat is None else lacking,
        )

    def _split(self, first: LevelResult, parent: str, culprit: str, old: str, new: str) -> Split:
        halves: list[tuple[str, str | None]] = [(parent, new), (culprit, old)]
        recorded = [self._recorded("split", *half) for half in halves]
        seen = [[self.verdict(a) for a in attempts] for attempts in recorded]
        self._reused("split", (a for attempts in recorded for a in attempts), level="split")
        good, bad = Verdict.GOOD, Verdict.BAD
        if self.repeat is None:
            # The halves only choose the route. When the code half's first run passes, the joint
            # chain walks through it and checks it with everything else, and the pointer half
            # only names the carrier: one run of each is enough. Otherwise the pointer half
            # decides the route, and both are judged to the confidence.
            once = [list(v[:1]) for v in seen]
            self._until_settled(
                len(halves),
                lambda i: bool(once[i]),
                self._runs_of("split", halves, once),
                lambda i: True,
            )
            for i, verdicts in enumerate(once):
                if not seen[i]:
                    seen[i].extend(verdicts)
            if once[1] == [good]:
                pointer = once[0][0]
                carrier = "interaction" if pointer is good else "pointer"
                return Split(pointer, good, carrier, anchor=culprit)
        pointer, code = self._judge_pairs("split", halves, seen, first)
        if code is good:
            # (culprit, old) passes, so the simpler range can be bisected with pypto at the culprit.
            carrier = "interaction" if pointer is good else "pointer"
            return Split(pointer, code, carrier, anchor=culprit)
        if pointer is bad:
            # (parent, old) passed at the first level and (parent, new) fails: bisect from there.
            return Split(pointer, code, "both" if code is bad else "pointer", anchor=parent)
        if code is bad or pointer is good:
            return Split(pointer, code, "code")
        # Neither half builds (a bump that adapts pypto to a new simpler API): the culprit's
        # code can still be run with the states inside the move that build with it.
        return Split(pointer, code, "unknown", anchor=culprit)


def _projected(
    joint: Belief, probabilities: Sequence[float], observations: Mapping[int, Sequence[Verdict]]
) -> Belief:
    """A level's share of the joint chain's posterior, for the report."""
    tallies = tally(observations)
    blocks = tuple((i, i, p) for i, p in enumerate(probabilities) if i > 0)
    return Belief(
        count=len(probabilities),
        probabilities=tuple(probabilities),
        false_fail=joint.false_fail,
        false_pass=joint.false_pass,
        blocks=blocks,
        tallies=tallies,
        consistent=joint.consistent,  # the rates are the chain's, learnt from all its runs
    )


def _pair_state(
    seen: Sequence[Verdict], expected: Verdict, rates: Belief, confidence: float
) -> Literal["confirmed", "failed", "again"]:
    verdict = pair_verdict(
        seen,
        false_fail=rates.false_fail,
        false_pass=rates.false_pass,
        confidence=confidence,
        prior_bad=EXPECTED_GOOD if expected is Verdict.GOOD else 1 - EXPECTED_GOOD,
    )
    if verdict is None:
        return "again"
    return "confirmed" if verdict is expected else "failed"


def undone_later(
    later: Sequence[str], gitlink: Callable[[str], str | None], old: str
) -> str | None:
    """A note when a later commit of the range puts the pointer back where the culprit's bump
    took it from: the known-bad end is then bad for some later reason as well, which a bisect
    that assumes one good-to-bad change cannot see."""
    back = next((commit for commit in later if gitlink(commit) == old), None)
    if back is None:
        return None
    return (
        f"{back[:12]}, later in the range, puts the pointer back to {old[:12]}, undoing this "
        "bump: the known-bad commit is bad for a later reason too; run again with --good "
        f"{back[:12]} to find it"
    )


def submodule_note(history: History, parent: str, change: Change, path: str) -> str:
    """Why a culprit that adds or removes the submodule has no second level, and what moved."""
    if change.new is None:
        return f"the culprit removes the {path} submodule: there is no simpler range to bisect"
    removed = history.removed_before(parent, path)
    if removed is None:
        return f"the culprit adds the {path} submodule: there is no simpler range to bisect"
    removal, pinned = removed
    back = f"the culprit adds the {path} submodule back (removed by {removal[:12]})"
    if pinned == change.new:
        return f"{back} at the commit it pinned then, {pinned[:12]}: simpler itself did not change"
    return (
        f"{back}: simpler moved {pinned[:12]}..{change.new[:12]} while pypto went without it, "
        "so there is no single bump to bisect"
    )


def _low_confidence_note(result: LevelResult, confidence: float) -> str:
    candidates = result.low_confidence or ()
    listed = ", ".join(f"{result.candidates[i][:12]} {p:.0%}" for i, p in candidates)
    top = candidates[0][1] if candidates else 0.0
    return (
        f"inconclusive: low confidence at the {result.level} level after {result.tests} tests; "
        f"candidates: {listed}{why_low(top, confidence)}"
    )


_NOT_BUILT = (".md", ".rst", ".txt")
_NOT_BUILT_DIRS = ("docs/", "doc/", "tests/", "test/", ".github/", ".gitlab/")
_BUILD_FILES = ("CMakeLists.txt", "pyproject.toml", "setup.py", "setup.cfg")
_BUILD_DIRS = ("src", "source", "cmake")


def _builds_from(path: str) -> bool:
    """Whether a changed path can plausibly change what gets built or run.

    Build descriptions count even where their suffix or folder looks like documentation:
    CMakeLists.txt is a .txt file, and a tests/CMakeLists.txt still shapes the build.
    """
    parts = path.split("/")
    name = parts[-1]
    if name in _BUILD_FILES or name.endswith(".cmake"):
        return True
    if any(part in _BUILD_DIRS for part in parts[:-1]):
        return True
    return not (path.endswith(_NOT_BUILT) or path.startswith(_NOT_BUILT_DIRS))


def _untold_halves(parent: str, culprit: str, change: Change) -> str:
    assert change.old is not None and change.new is not None
    return (
        f"neither half of the bump {culprit[:12]} builds on its own ({parent[:12]} with the new "
        f"simpler {change.new[:12]}, and its own code with the old {change.old[:12]}): whether "
        f"its code or its simpler move {change.old[:12]}..{change.new[:12]} carries the "
        "regression cannot be told"
    )


def describe_split(split: Split) -> str:
    texts: Mapping[str, str] = {
        "pointer": "the simpler pointer move carries the regression",
        "code": "pypto's code changes carry the regression; the pointer move alone passes",
        "both": "both halves regress on their own: pypto's code and the simpler pointer move",
        "interaction": "each half passes alone: only the new pypto code with the new simpler fails",
        "unknown": "neither half could be tested on its own",
    }
    return texts[split.carrier]
