"""How often the confidence search names the right culprit, and what it costs, over many seeds.

Drives the real `runner.session.Session` on one generated two-level history (real git, made once)
with a tester that answers like a seeded flaky example: each seed picks the good and bad ends and
where the regression is (a pypto commit; a simpler commit inside a pointer-only bump; one inside a
bump that also changes pypto code), and the tester lies with the scenario's false-fail and
false-pass rates. Per scenario it prints how many seeds ended with the right culprit and exit 0,
how many with a wrong culprit and exit 0 (confidently wrong), how many ended without a culprit,
and the tests each session ran (drift re-runs, endpoint and good-end checks included) next to a
plain bisection (one run per commit, no drift check), as mean/max over the seeds: next to the plain
run of the same history, and next to plain bisection's worst case (the endpoints, ceil(log2 n) per
level, the second level's good end, a split bump's two halves).

Targets with the default confidence 0.95: flaky scenarios right in at least 95 % of the seeds and
confidently wrong in at most 5 %; deterministic ones at most 3 tests over plain bisection.

    python tests/bench/bench_confidence.py [--seeds 200] [--only flaky-10] [--seed-offset 1000]
        [--explain] [--lanes 2]

``--seed-offset`` draws other histories and other lies (a check that a change is not tuned to
the default seeds); ``--lanes`` runs rounds of that many tests at once, as on that many devices
(the rounds column; the cost bound over plain bisection is for one lane); ``--explain`` prints
each confidently wrong seed's runs next to the truth and the probability the culprit would have
with the true flake rates known.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runner.confidence import DEFAULT_CONFIDENCE
from runner.history import Change, History, pointer_states
from runner.ledger import Attempt, Level
from runner.sample.histories import Sample, SampleSpec, make_sample
from runner.search import Verdict
from runner.session import EndpointFailure, LevelResult, Outcome, Request, Session

# The runtime exists from pypto 1; a pointer-only bump at 14 (simpler 0 -> 12) and a bump that also
# changes pypto code at 27 (12 -> 23); 40 pypto commits, so ranges of 6 to 40 commits.
SPEC = SampleSpec(
    pypto_commits=40,
    simpler_commits=24,
    runtime_added_at=1,
    runtime_initial=0,
    bumps=((14, 12), (27, 23)),
    code_with_bump=frozenset({27}),
    libbacktrace_url_change_at=3,
    nested_submodule_at=2,
)
POINTER_BUMP, CODE_BUMP = 14, 27

KINDS = ("pypto", "pointer-bump", "code-bump")
FLAKES = {
    "deterministic": (0.0, 0.0),
    "flaky-10": (0.1, 0.1),
    "fail-5-pass-30": (0.05, 0.3),
    "fail-30-pass-5": (0.3, 0.05),
}


@dataclass(frozen=True)
class Case:
    """One hidden history: the ends of the bisect and the first bad pypto or simpler index."""

    kind: str
    good: int
    bad: int
    pypto_at: int | None = None
    simpler_at: int | None = None

    @property
    def culprit(self) -> int:
        if self.pypto_at is not None:
            return self.pypto_at
        return POINTER_BUMP if self.kind == "pointer-bump" else CODE_BUMP


def draw_case(kind: str, rng: random.Random) -> Case:
    if kind == "pypto":
        good = rng.randint(1, SPEC.pypto_commits - 6)
        bad = rng.randint(good + 5, SPEC.pypto_commits)
        choices = [i for i in range(good + 1, bad + 1) if i not in SPEC.bump_indices]
        return Case(kind, good, bad, pypto_at=rng.choice(choices))
    if kind == "pointer-bump":
        good = rng.randint(0, POINTER_BUMP - 5)
        bad = rng.randint(POINTER_BUMP, CODE_BUMP - 1)
        return Case(kind, good, bad, simpler_at=rng.randint(1, 12))
    good = rng.randint(POINTER_BUMP, CODE_BUMP - 4)
    bad = rng.randint(CODE_BUMP, SPEC.pypto_commits)
    return Case(kind, good, bad, simpler_at=rng.randint(13, 23))


class CachedHistory(History):
    """Real git, asked once per question: every session of the benchmark reads the same repo."""

    def __init__(self, repo: Path) -> None:
        super().__init__(repo)
        self._memo: dict[tuple, object] = {}

    def _once(self, key: tuple, compute):  # type: ignore[no-untyped-def]
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def first_parent_range(self, good: str, bad: str) -> list[str]:
        found = self._once(("range", good, bad), lambda: super(CachedHistory, self)
                           .first_parent_range(good, bad))  # fmt: skip
        return list(found)  # type: ignore[arg-type]

    def gitlinks(self, chain: Sequence[str], path: str = "runtime") -> dict[str, str | None]:
        compute = lambda: super(CachedHistory, self).gitlinks(chain, path)  # noqa: E731
        return dict(self._once(("gitlinks", tuple(chain), path), compute))  # type: ignore[call-overload]

    def gitlink(self, commit: str, path: str = "runtime") -> str | None:
        compute = lambda: super(CachedHistory, self).gitlink(commit, path)  # noqa: E731
        return self._once(("gitlink", commit, path), compute)  # type: ignore[return-value]

    def subject(self, commit: str) -> str:
        compute = lambda: super(CachedHistory, self).subject(commit)  # noqa: E731
        return self._once(("subject", commit), compute)  # type: ignore[return-value]

    def classify(self, commit: str, path: str = "runtime") -> Change:
        compute = lambda: super(CachedHistory, self).classify(commit, path)  # noqa: E731
        return self._once(("classify", commit, path), compute)  # type: ignore[return-value]


class FlakyExample:
    """Answers like the example would on a hidden history, lying at the given rates."""

    def __init__(
        self,
        sample: Sample,
        case: Case,
        false_fail: float,
        false_pass: float,
        seed: int,
        parallel: int = 1,
    ) -> None:
        self.sample = sample
        self.parallel = parallel  # devices: the session asks rounds of up to this many tests
        self.rounds = 0
        self.case = case
        self.false_fail = false_fail
        self.false_pass = false_pass
        self.rng = random.Random(seed)
        self.attempts: list[Attempt] = []
        self._by_pair: dict[tuple[str, str | None], list[Attempt]] = {}

    def lookup(self, pypto: str, simpler: str | None) -> list[Attempt]:
        return list(self._by_pair.get((pypto, simpler), []))

    def truth(self, pypto: str, simpler: str | None) -> Verdict:
        if self.case.pypto_at is not None:
            bad = self.sample.pypto_index(pypto) >= self.case.pypto_at
        else:
            assert self.case.simpler_at is not None
            bad = simpler is not None and self.sample.simpler_index(simpler) >= self.case.simpler_at
        return Verdict.BAD if bad else Verdict.GOOD

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        verdict = self.truth(pypto, simpler)
        lie = self.false_pass if verdict is Verdict.BAD else self.false_fail
        if self.rng.random() < lie:
            verdict = Verdict.GOOD if verdict is Verdict.BAD else Verdict.BAD
        when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=len(self.attempts))
        attempt = Attempt(
            run_id=f"{len(self.attempts):04d}",
            level=level,
            pypto_sha=pypto,
            simpler_sha=simpler,
            verdict=verdict,
            started_at=when,
            finished_at=when,
        )
        self.attempts.append(attempt)
        self._by_pair.setdefault((pypto, simpler), []).append(attempt)
        return attempt

    def test_round(
        self, requests: Sequence[Request], done: Callable[[Attempt], None]
    ) -> list[Attempt]:
        self.rounds += 1
        attempts = []
        for request in requests:
            attempts.append(self.test(request.level, request.pypto, request.simpler))
            done(attempts[-1])
        return attempts


def run_session(
    sample: Sample,
    history: History,
    case: Case,
    flake: tuple[float, float],
    seed: int,
    explain: list[str] | None = None,
    lanes: int = 1,
    **options: object,
) -> tuple[Outcome | None, int, int]:
    tester = FlakyExample(sample, case, *flake, seed=seed, parallel=lanes)
    session = Session(
        history,
        tester,
        tester.lookup,
        good=sample.pypto_shas[case.good],
        bad=sample.pypto_shas[case.bad],
        simpler_states=lambda old, new: pointer_states(sample.runtime_gitdir, old, new),
        merge_base=history.merge_base,
        **options,  # type: ignore[arg-type]
    )
    try:
        outcome = session.run()
    except EndpointFailure:
        return None, len(tester.attempts), tester.rounds
    if explain is not None:
        explain.extend(explanation(sample, tester, session, outcome))
    return outcome, len(tester.attempts), tester.rounds


def explanation(
    sample: Sample, tester: FlakyExample, session: Session, outcome: Outcome
) -> list[str]:
    """Each level's runs next to the truth, and what the answer's probability would be with
    the true flake rates known (the model integrates them out)."""
    case = tester.case
    lines = [
        f"  {case}: answered pypto {sample.pypto_index(outcome.pypto.first_bad or '')}"
        f" simpler {_simpler(sample, outcome.simpler_culprit)} ({outcome.source}, "
        f"p={outcome.pypto.probability}, descended={outcome.pypto.descended}, "
        f"split={outcome.split and outcome.split.carrier})"
    ]
    levels: list[tuple[str, LevelResult]] = [("pypto", outcome.pypto)]
    chain = getattr(session, "_chain", None)
    if chain is not None:
        levels.append(("chain", chain))
    elif outcome.simpler is not None:
        levels.append(("simpler", outcome.simpler))
    for name, level in levels:
        pairs = [_pair_of(session, level, label) for label in level.candidates]
        truth = [tester.truth(*pair) for pair in pairs]
        runs = []
        for index, seen in sorted(level.observations.items()):
            lies = sum(v is not truth[index] for v in seen)
            marks = "".join("+" if v is Verdict.GOOD else "-" for v in seen)
            pypto, simpler = pairs[index]
            runs.append(
                f"{index}[{sample.pypto_index(pypto)}/{_simpler(sample, simpler)}]"
                f"{'B' if truth[index] is Verdict.BAD else 'g'}:{marks}{'!' * lies}"
            )
        known = _known_rate_posterior(
            level, truth, tester.false_fail or 1e-9, tester.false_pass or 1e-9
        )
        found = level.found or 0
        model = level.belief.probabilities[found] if level.belief else 0.0
        # runs the reported boundary calls lies: none means the record looks deterministic
        seeming = sum(
            (v is Verdict.BAD) != (index >= found)
            for index, seen in level.observations.items()
            for v in seen
        )
        lines.append(
            f"  {name} found={level.found} p={model:.3f} known-rates p={known[found]:.3f}"
            f" true={truth.index(Verdict.BAD)} contradictions={seeming}"
        )
        lines.append("    " + " ".join(runs))
    return lines


def _simpler(sample: Sample, simpler: str | None) -> str:
    return "-" if simpler is None else str(sample.simpler_index(simpler))


def _pair_of(session: Session, level: LevelResult, label: str) -> tuple[str, str | None]:
    if level.pairs is not None:
        return level.pairs[label]
    if level.level == "simpler":
        return level.anchor or "", label
    return label, session.gitlink(label)


def _known_rate_posterior(
    level: LevelResult, truth: Sequence[Verdict], false_fail: float, false_pass: float
) -> list[float]:
    count = len(level.candidates)
    logs = [-math.inf]
    for h in range(1, count):
        log = math.log(level.weights[h]) if level.weights else 0.0
        for index, seen in level.observations.items():
            fails = sum(v is Verdict.BAD for v in seen)
            passes = sum(v is Verdict.GOOD for v in seen)
            if index < h:
                log += fails * math.log(false_fail) + passes * math.log(1 - false_fail)
            else:
                log += passes * math.log(false_pass) + fails * math.log(1 - false_pass)
        logs.append(log)
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    return [w / sum(weights) for w in weights]


def plain_bound(outcome: Outcome) -> int:
    """What plain bisection costs at most: the endpoint runs, each level's ceil(log2 n) steps,
    the second level's good end and the two halves of a split bump."""
    tests = 2
    for level in (outcome.pypto, outcome.simpler):
        if level is not None and len(level.candidates) > 2:
            tests += math.ceil(math.log2(len(level.candidates) - 1))
    if outcome.simpler is not None:
        tests += 1
    if outcome.split is not None:
        tests += 2
    return tests


def is_right(sample: Sample, case: Case, outcome: Outcome) -> bool:
    if outcome.pypto.first_bad != sample.pypto_shas[case.culprit]:
        return False
    if case.simpler_at is None:
        return outcome.source == "pypto"
    return outcome.simpler_culprit == sample.simpler_shas[case.simpler_at]


@dataclass
class Row:
    scenario: str
    kind: str
    seeds: int = 0
    right: int = 0
    wrong: int = 0
    unsure: int = 0
    tests: list[int] | None = None
    rounds: list[int] | None = None
    extra: list[int] | None = None  # over this history's plain bisection run
    over: list[int] | None = None  # over plain bisection's worst case


def scenario_row(
    sample: Sample,
    history: History,
    name: str,
    kind: str,
    seeds: int,
    confidence: float,
    plain_cache: dict[Case, tuple[int, int]],
    offset: int = 0,
    explain: bool = False,
    lanes: int = 1,
) -> Row:
    flake = FLAKES[name]
    row = Row(name, kind, tests=[], rounds=[], extra=[], over=[])
    assert row.tests is not None and row.rounds is not None
    assert row.extra is not None and row.over is not None
    cases = random.Random(f"{kind}:{seeds}" if offset == 0 else f"{kind}:{seeds}:{offset}")
    for seed in range(offset, offset + seeds):
        case = draw_case(kind, cases)
        if case not in plain_cache:
            plain, plain_tests, _ = run_session(
                sample, history, case, (0.0, 0.0), 0, repeat=1, drift_check=False
            )
            assert plain is not None and is_right(sample, case, plain), case
            plain_cache[case] = plain_tests, plain_bound(plain)
        lines: list[str] | None = [] if explain else None
        outcome, tests, rounds = run_session(
            sample, history, case, flake, seed, lines, lanes, confidence=confidence
        )
        row.seeds += 1
        row.tests.append(tests)
        row.rounds.append(rounds)
        row.extra.append(tests - plain_cache[case][0])
        row.over.append(tests - plain_cache[case][1])
        if outcome is None or outcome.exit_code != 0:
            row.unsure += 1
        elif is_right(sample, case, outcome):
            row.right += 1
        else:
            row.wrong += 1
            if lines:
                print(f"confidently wrong: {name} {kind} seed {seed}", *lines, sep="\n")
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds per scenario")
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    parser.add_argument("--only", action="append", choices=sorted(FLAKES), help="flake scenario")
    parser.add_argument("--kind", action="append", choices=KINDS, help="history kind")
    parser.add_argument(
        "--seed-offset", type=int, default=0, help="first seed: other histories, other lies"
    )
    parser.add_argument(
        "--explain", action="store_true", help="print the runs of each confidently wrong seed"
    )
    parser.add_argument(
        "--lanes", type=int, default=1, help="devices: rounds of up to this many tests"
    )
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-confidence-") as tmp:
        sample = make_sample(Path(tmp), SPEC)
        history = CachedHistory(sample.pypto)
        plain_cache: dict[Case, tuple[int, int]] = {}
        header = (
            f"{'scenario':<16}{'history':<14}{'seeds':>6}{'right':>8}{'conf.wrong':>11}"
            f"{'no answer':>10}{'tests':>7}{'vs plain run':>14}{'vs log2 bound':>15}"
            f"{'rounds':>8}"
        )
        print(header)
        print("-" * len(header))
        failed = False
        for name in args.only or list(FLAKES):
            for kind in args.kind or list(KINDS):
                row = scenario_row(
                    sample,
                    history,
                    name,
                    kind,
                    args.seeds,
                    args.confidence,
                    plain_cache,
                    args.seed_offset,
                    args.explain,
                    args.lanes,
                )
                assert row.tests is not None and row.rounds is not None
                assert row.extra is not None and row.over is not None
                n = row.seeds
                print(
                    f"{row.scenario:<16}{row.kind:<14}{n:>6}{row.right / n:>8.1%}"
                    f"{row.wrong / n:>11.1%}{row.unsure / n:>10.1%}"
                    f"{statistics.mean(row.tests):>7.1f}"
                    f"{statistics.mean(row.extra):>+9.2f}/{max(row.extra):<+4d}"
                    f"{statistics.mean(row.over):>+10.2f}/{max(row.over):<+4d}"
                    f"{statistics.mean(row.rounds):>8.1f}",
                    flush=True,
                )
                if name == "deterministic":
                    # (rounds of several tests spend more tests than plain bisection's steps)
                    failed |= (args.lanes == 1 and max(row.over) > 3) or row.right < n
                else:
                    failed |= row.right < 0.95 * n or row.wrong > (1 - args.confidence) * n
    print(f"({time.perf_counter() - started:.0f} s; targets {'missed' if failed else 'met'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
