"""Drives a whole two-level bisect from the ledger.

The session decides *what* to test; a `Tester` decides *how* (export, build, image, run). With the
Docker tester it runs a bisect; with a tester that only reads the ledger it replays one, which is
how `status` and `report` rebuild their picture without touching Docker. Git is only reached
through `History` and the `simpler_states` callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from runner.errors import BisectError
from runner.history import Change, History
from runner.ledger import Attempt, Level
from runner.search import Found, Inconclusive, Test, Verdict, bounds, next_step, steps_left

Source = Literal["pypto", "simpler", "inconclusive"]
Lookup = Callable[[str, str | None], Attempt | None]
SimplerStates = Callable[[str, str], tuple[str, list[str]]]


class Pending(Exception):
    """Raised by a replaying tester: the bisect needs a test the ledger does not hold yet."""

    def __init__(self, level: Level, pypto: str, simpler: str | None) -> None:
        super().__init__(f"{level} test of {pypto[:12]} with simpler {(simpler or 'none')[:12]}")
        self.level = level
        self.pypto = pypto
        self.simpler = simpler


class Tester(Protocol):
    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt: ...


class Events(Protocol):
    def level_started(self, level: Level, count: int, note: str) -> None: ...
    def step_started(
        self, level: Level, done: int, left: int, pypto: str, simpler: str | None, subject: str
    ) -> None: ...
    def attempt_done(self, attempt: Attempt, reused: bool, subject: str) -> None: ...
    def note(self, text: str) -> None: ...


class QuietEvents:
    def level_started(self, level: Level, count: int, note: str) -> None:
        pass

    def step_started(
        self, level: Level, done: int, left: int, pypto: str, simpler: str | None, subject: str
    ) -> None:
        pass

    def attempt_done(self, attempt: Attempt, reused: bool, subject: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class EndpointFailure(Exception):
    """An endpoint did not give its expected verdict; carries the attempt for the message."""

    def __init__(self, which: Literal["good", "bad"], attempt: Attempt) -> None:
        super().__init__(which)
        self.which = which
        self.attempt = attempt


@dataclass
class LevelResult:
    """One level's bisect: candidates[0] is known good, candidates[-1] known bad."""

    level: Level
    candidates: list[str]
    anchor: str | None = None  # simpler level: the pypto commit every state is tested with
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    found: int | None = None
    inconclusive: tuple[int, int] | None = None
    tests: int = 0

    @property
    def done(self) -> bool:
        return self.found is not None or self.inconclusive is not None

    @property
    def first_bad(self) -> str | None:
        return None if self.found is None else self.candidates[self.found]

    @property
    def last_good(self) -> str | None:
        if self.found is not None:
            return self.candidates[self.found - 1]
        if self.inconclusive is not None:
            return self.candidates[self.inconclusive[0] - 1]
        return None

    @property
    def suspects(self) -> list[str]:
        """Every candidate that can still be the first bad one."""
        if self.found is not None:
            return [self.candidates[self.found]]
        if self.inconclusive is not None:
            first, last = self.inconclusive
            return self.candidates[first : last + 1]
        lo, hi = bounds(len(self.candidates), self.verdicts)
        return self.candidates[lo + 1 : hi + 1]

    @property
    def steps_left(self) -> int:
        if self.done:
            return 0
        return steps_left(len(self.candidates), self.verdicts)


@dataclass
class Split:
    """The code-vs-pointer tests of a culprit that changes pypto code and moves the pointer."""

    pointer_half: Verdict  # pypto at the parent, simpler at the new pointer
    code_half: Verdict  # pypto at the culprit, simpler at the old pointer
    carrier: Literal["pointer", "code", "both", "interaction", "unknown"]
    anchor: str | None = None  # the pypto commit to bisect simpler with; None: no second level


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
    merge_base_index: int = -1  # diverged pointers: where the path turns from backward to forward

    @property
    def finished(self) -> bool:
        return self.pending is None

    @property
    def exit_code(self) -> int:
        if self.endpoint_failure is not None:
            return 3
        if self.source == "inconclusive":
            return 1
        if self.source == "simpler" and self.simpler is not None and self.simpler.found is None:
            return 1
        return 0

    @property
    def simpler_culprit(self) -> str | None:
        """The simpler commit to blame: the first bad state going forward; going backward, the
        commit whose removal brought the regression back."""
        level = self.simpler
        if level is None or level.found is None:
            return None
        if self._backward_step(level.found):
            return level.candidates[level.found - 1]
        return level.candidates[level.found]

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
        events: Events | None = None,
    ) -> None:
        self.history = history
        self.tester = tester
        self.lookup = lookup
        self.good = good
        self.bad = bad
        self.path = submodule_path
        self.verify = verify
        self.simpler_states = simpler_states
        self.merge_base = merge_base
        self.simpler_subject = simpler_subject
        self.events = events or QuietEvents()
        self._gitlinks: dict[str, str | None] = {}
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

    def _test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        subject = self.subject(pypto, simpler, level)
        known = self.lookup(pypto, simpler)
        if known is not None:
            self.events.attempt_done(known, reused=True, subject=subject)
            return known
        attempt = self.tester.test(level, pypto, simpler)
        self.events.attempt_done(attempt, reused=False, subject=subject)
        return attempt

    def _known(self, pypto: str, simpler: str | None) -> Verdict | None:
        attempt = self.lookup(pypto, simpler)
        return None if attempt is None else attempt.verdict

    # -- level runner ----------------------------------------------------------------------

    def _bisect(self, result: LevelResult, pair: Callable[[str], tuple[str, str | None]]) -> None:
        count = len(result.candidates)
        reused = 0
        for index, commit in enumerate(result.candidates):
            if index not in result.verdicts:
                verdict = self._known(*pair(commit))
                if verdict is not None:
                    result.verdicts[index] = verdict
                    reused += 1
        if reused:
            self.events.note(f"{reused} {result.level} verdicts reused from the ledger")
        while True:
            step = next_step(count, result.verdicts)
            if isinstance(step, Found):
                result.found = step.index
                return
            if isinstance(step, Inconclusive):
                result.inconclusive = (step.first, step.last)
                return
            assert isinstance(step, Test)
            index = step.indices[0]
            commit = result.candidates[index]
            pypto, simpler = pair(commit)
            self.events.step_started(
                result.level,
                result.tests,
                result.steps_left,
                pypto,
                simpler,
                self.subject(pypto, simpler, result.level),
            )
            attempt = self._test(result.level, pypto, simpler)
            result.tests += 1
            result.verdicts[index] = attempt.verdict

    # -- the whole bisect -------------------------------------------------------------------

    def run(self) -> Outcome:
        commits = self.history.first_parent_range(self.good, self.bad)
        first = LevelResult("pypto", [self.good, *commits])
        self._gitlinks.update(self.history.gitlinks(first.candidates, self.path))
        self._partial = Outcome("inconclusive", first)
        try:
            return self._run(first)
        except Pending as pending:
            # Replay ran out of recorded verdicts: report how far the session got, levels included.
            self._partial.pending = pending
            return self._partial

    def _run(self, first: LevelResult) -> Outcome:
        self.events.level_started("pypto", len(first.candidates) - 1, "pypto first-parent commits")
        if self.verify:
            self._verify_endpoints(first)
        self._bisect(first, lambda commit: (commit, self.gitlink(commit)))
        if first.found is None:
            return Outcome("inconclusive", first)
        culprit = first.candidates[first.found]
        parent = first.candidates[first.found - 1]
        change = self.history.classify(culprit, self.path)
        outcome = Outcome("pypto", first, change=change)
        self._partial = outcome
        if not change.moved and not any(_builds_from(path) for path in change.changed_paths):
            outcome.notes.append(
                "the culprit changes no build input (only docs, tests or CI files), so its verdict "
                "may be noise: run `reproduce` on it and on its parent before trusting it"
            )
        if not change.moved:
            return outcome
        if change.old is None or change.new is None:
            what = "adds" if change.old is None else "removes"
            outcome.notes.append(
                f"the culprit {what} the {self.path} submodule: there is no simpler range to bisect"
            )
            return outcome

        anchor = culprit
        if change.kind == "pointer-and-code":
            split = self._split(parent, culprit, change.old, change.new)
            outcome.split = split
            if split.anchor is None:
                return outcome
            anchor = split.anchor
            if anchor == parent:
                outcome.notes.append(
                    f"simpler is bisected with pypto at the culprit's parent {parent[:12]}"
                )
        try:
            direction, states = self.simpler_states(change.old, change.new)
        except BisectError as exc:
            # The pypto culprit stands; only the descent is impossible (objects missing locally).
            outcome.source = "inconclusive"
            outcome.notes.append(f"the simpler range cannot be bisected: {exc}")
            return outcome
        outcome.direction = direction
        if direction == "diverged" and self.merge_base is not None:
            base = self.merge_base(change.old, change.new)
            if base in states:
                outcome.merge_base_index = states.index(base)
        second = LevelResult("simpler", states, anchor=anchor)
        outcome.simpler = second
        outcome.source = "simpler"
        if len(states) < 2:
            outcome.notes.append("the old and new simpler pointers have no commits between them")
            return outcome
        second.verdicts[len(states) - 1] = Verdict.BAD
        self.events.level_started(
            "simpler", len(states) - 1, f"simpler states {direction} with pypto at {anchor[:12]}"
        )
        self._bisect(second, lambda state: (anchor, state))
        return outcome

    def _verify_endpoints(self, first: LevelResult) -> None:
        last = len(first.candidates) - 1
        checks = ((0, Verdict.GOOD, "good"), (last, Verdict.BAD, "bad"))
        for position, (index, expected, which) in enumerate(checks):
            commit = first.candidates[index]
            simpler = self.gitlink(commit)
            left = first.steps_left + len(checks) - position  # this check and those after it
            self.events.step_started(
                "pypto", first.tests, left, commit, simpler, self.subject(commit)
            )
            attempt = self._test("pypto", commit, simpler)
            first.tests += 1
            if attempt.verdict is not expected:
                raise EndpointFailure(which, attempt)
            first.verdicts[index] = attempt.verdict

    def _split(self, parent: str, culprit: str, old: str, new: str) -> Split:
        pointer = self._test("split", parent, new).verdict
        code = self._test("split", culprit, old).verdict
        good, bad = Verdict.GOOD, Verdict.BAD
        if code is good:
            # (culprit, old) passes, so the simpler range can be bisected with pypto at the culprit.
            carrier = "interaction" if pointer is good else "pointer"
            return Split(pointer, code, carrier, anchor=culprit)
        if pointer is bad:
            # (parent, old) passed at the first level and (parent, new) fails: bisect from there.
            return Split(pointer, code, "both" if code is bad else "pointer", anchor=parent)
        if code is bad or pointer is good:
            return Split(pointer, code, "code")
        return Split(pointer, code, "unknown")


_NOT_BUILT = (".md", ".rst", ".txt")
_NOT_BUILT_DIRS = ("docs/", "doc/", "tests/", "test/", ".github/", ".gitlab/")


def _builds_from(path: str) -> bool:
    """Whether a changed path can plausibly change what gets built or run."""
    return not (path.endswith(_NOT_BUILT) or path.startswith(_NOT_BUILT_DIRS))


def describe_split(split: Split) -> str:
    texts: Mapping[str, str] = {
        "pointer": "the simpler pointer move carries the regression",
        "code": "pypto's code changes carry the regression; the pointer move alone passes",
        "both": "both halves regress on their own: pypto's code and the simpler pointer move",
        "interaction": "each half passes alone: only the new pypto code with the new simpler fails",
        "unknown": "neither half could be tested on its own",
    }
    return texts[split.carrier]
