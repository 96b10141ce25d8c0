"""One attempt: export sources, build or reuse the wheels, layer the image, run, judge, record.

This is the only place where the pieces that touch git, the cache and Docker meet; it decides
nothing about the bisect, it only answers "what does this (pypto, simpler) pair give?".
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import threading
import time
import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType

from runner.builders import Builder
from runner.devices import Passthrough
from runner.errors import (
    INFRASTRUCTURE_LOG,
    RETIRED,
    USER_SKIP,
    BadInput,
    BuildTimedOut,
    ExampleStopped,
    InfrastructureError,
    LedgerError,
    SourceUnavailable,
    UnbuildableCommit,
)
from runner.execute import ExampleRun
from runner.executor import BuildJob, DeviceFault, Executor, RunJob
from runner.fingerprint import Collector
from runner.images import WheelInstallFailed
from runner.ledger import AheadBuild, Attempt, Ledger, Level, claim_run_dir, placement
from runner.noop import wheel_content_digest
from runner.search import Verdict
from runner.session import More, Request
from runner.sources import SourceExporter
from runner.toolchains import Toolchains, skippable
from runner.turns import Turns
from runner.verdict import VerdictPatterns, infrastructure_fault, judge, stopped
from runner.wheels import BuildSettings, WheelCache, WheelResult, wheel_id

Phase = Callable[[str], None]


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class RunSettings:
    """How the example runs; everything here is part of the session's identity."""

    lib_dir: Path
    script: str
    platform: str
    device: str
    passthrough: Passthrough
    extra_args: list[str] = field(default_factory=list)
    python: str = "python3"
    environment: dict[str, str] = field(default_factory=dict)
    ptoas_root: Path | None = None
    pto_isa_root: Path | None = None
    cpus: float | None = None
    memory: str | None = None
    timeout: float | None = None
    patterns: VerdictPatterns = field(default_factory=VerdictPatterns)


RETRY_PAUSE_MAX_S = 8.0
"""The longest pause before a test is tried again after an infrastructure fault."""

# Builds ahead start only while the median example run lasts at least this share of the
# median wheel build (see `DockerTester._worth_guessing`).
GUESS_RUN_SHARE = 0.5
# A guess under way yields its build slot to a likelier one while it has run less than this
# share of the median wheel build (see `DockerTester._yielding`).
YIELD_SHARE = 0.5


class DockerTester:
    """Tests (pypto, simpler) pairs through an executor and records every attempt in the ledger.

    A round's tests run at once, one per device slot; this thread alone writes the ledger, as
    each test finishes. Infrastructure faults (timeouts, OOM kills, a full disk, engine or
    device errors) are never recorded: the test is retried (a faulty device leaves the pool),
    and after `infra_retries` in a row the run stops (exit 4) so that the next run tries again
    instead of reusing a verdict that says nothing.
    """

    def __init__(
        self,
        executor: Executor,
        ledger: Ledger,
        exporter: SourceExporter,
        cache: WheelCache,
        build: BuildSettings,
        run: RunSettings,
        *,
        workdir: Path,
        ccache_dir: Path,
        submodule_path: str = "runtime",
        toolchains: Toolchains | None = None,
        omit: Collection[str] = (),
        infra_retries: int = 3,
        phase: Phase | None = None,
        echo: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        fingerprint: Collector | None = None,
        prefetch: bool = True,
        skip: Collection[str] = (),
        ahead: Callable[[int], None] | None = None,
    ) -> None:
        """`echo` streams logs (--verbose); `warn` says what the user must know anyway;
        `skip`: pypto and simpler commits the user takes as untestable (--skip); `ahead`
        hears how many guessed pairs are being built whenever that changes."""
        self.executor = executor
        self.skip = frozenset(skip)
        self.speculate = prefetch
        self.ahead = ahead or (lambda _count: None)
        self._guessing = 0  # guessed pairs whose wheels are being built
        self.fingerprint = fingerprint
        self.ledger = ledger
        self.exporter = exporter
        self.cache = cache
        self.build = build
        self.run = run
        self.workdir = workdir
        self.ccache_dir = ccache_dir
        self.path = submodule_path
        self.toolchains = toolchains
        self.omit = tuple(omit)
        self.infra_retries = max(1, infra_retries)
        self._show_phase = phase or (lambda _name: None)
        self._phase_lock = threading.Lock()
        self._phase_shown = ""
        self.echo = echo
        self.warn = warn
        self._git = Turns()  # mirror reads: a round's tests at once, a guess alone after them
        self._claim = threading.Lock()
        self._claimed: list[str] = []
        self._built: set[tuple[str, str]] = {
            (entry.package, wheel_id(entry.commit, entry.inputs))
            for entry in cache.entries()
            if entry.ok
        }
        # pypto commit -> whether its build reads the runtime, and the runtime commit it pins
        self._reads: dict[str, tuple[bool, str | None]] = {}
        self._ends: set[str | None] = set()  # the range's ends and their pins (`preflight`)
        self._prefetched: set[tuple[str, str | None]] = set()
        self._wanted: list[tuple[str, str | None]] = []  # guesses not started, in order
        self._ahead_cond = threading.Condition()
        self._ahead_worker: threading.Thread | None = None
        self._stopping = False
        # Tests of the round not yet past their builds (their image and run are the
        # executor's to count), and when a round was announced that has not started yet.
        self._preparing = 0
        self._announced: float | None = None
        # Example run and wheel build times of this session (see `_worth_guessing`).
        self._run_times: list[float] = []
        self._build_times: list[float] = []
        # pypto commits already layered into a test image (see `_run_job`).
        self._layered: set[str] = {a.pypto_sha for a in ledger.document.attempts if a.image_id}
        self._ahead: list[AheadBuild] = []  # finished speculative builds, until recorded
        self._ahead_images: list[str] = []  # test images layered ahead, until recorded
        self._ahead_lock = threading.Lock()
        rounds = [a.round for a in ledger.document.attempts if a.round is not None]
        self._round = max(rounds, default=0)
        self._pipelines = ThreadPoolExecutor(max_workers=16, thread_name_prefix="attempt")

    @property
    def parallel(self) -> int:
        """Tests one round can run: the device slots still in the pool."""
        return max(1, len(self.executor.slots))

    def preflight(
        self,
        commits: Sequence[str],
        gitlinks: Mapping[str, str | None],
        endpoints: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        """Check that the endpoints (`which` -> commit) can be exported, then resolve and
        download the build tools of the range, all before the first bisect step."""
        omitted: set[str] = set()
        self._ends = {c for commit in endpoints.values() for c in (commit, gitlinks.get(commit))}
        for which, commit in endpoints.items():
            try:
                self._check_sources(commit, gitlinks.get(commit), omitted=omitted)
            except SourceUnavailable as exc:
                raise SourceUnavailable(
                    f"the known-{which} commit {commit[:12]} cannot be exported: {exc}",
                    submodule=exc.submodule,
                ) from None
        if endpoints and self.warn is not None:
            for path in sorted(set(self.omit) - omitted):
                self.warn(
                    f"--omit-submodule {path}: neither endpoint has a submodule there (nested "
                    "paths look like runtime/third_party/x); it omits nothing unless a commit "
                    "in between has one"
                )
        if self.toolchains is not None:
            self.toolchains.plan(commits, gitlinks, skip=self.skip, warn=self.warn)

    def exportable_again(self, skips: Sequence[Attempt]) -> list[str]:
        """The run ids of skips for missing sources whose pair the checkout can export now."""
        ready: list[str] = []
        verdicts: dict[tuple[str, str | None], bool] = {}
        for attempt in skips:
            pair = (attempt.pypto_sha, attempt.simpler_sha)
            if pair not in verdicts:
                try:
                    self._check_sources(*pair)
                except SourceUnavailable:
                    verdicts[pair] = False
                else:
                    verdicts[pair] = True
            if verdicts[pair]:
                ready.append(attempt.run_id)
        return ready

    def close(self, *, cancel: bool) -> None:
        with self._ahead_cond:
            self._stopping = True
            self._wanted = []
            self._ahead_cond.notify_all()
        if cancel and self.toolchains is not None:
            # Interpreter exit joins the pipeline threads: none may go on making a builder.
            self.toolchains.provisioner.stop()
        self.executor.close(cancel=cancel)
        self._pipelines.shutdown(wait=not cancel, cancel_futures=True)
        if self.fingerprint is not None:
            self.fingerprint.close()
        self.cache.release()
        with contextlib.suppress(LedgerError):
            self._record_ahead()

    def _record_ahead(self) -> None:
        """Speculative builds that finished. Each build has one owner (see
        `runner.executor.SharedBuild`): a guess that a test joined is the test's build, and two
        guesses that share a wheel own it once."""
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, []
            images, self._ahead_images = self._ahead_images, []
        self.ledger.record_ahead(ahead, images)

    # -- what the session calls ----------------------------------------------------------

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        return self.test_round([Request(level, pypto, simpler)])[0]

    # `test_round` takes `more`: the session may add tests while the others still run.
    adds_requests = True

    def test_round(
        self,
        requests: Sequence[Request],
        done: Callable[[Attempt], None] | None = None,
        more: More | None = None,
    ) -> list[Attempt]:
        """Run the requests at once; record each attempt as it finishes; return them in order.

        `more(attempt, index, pending)`, after each attempt is recorded (`index` its place in
        the call, `pending` the places still running): requests to start now, and whether they
        belong to the round of the last requests started (else they open the next round). They
        are returned after the first ones, in the order they were added.

        A request that keeps failing at the infrastructure level stops the run (exit 4) once the
        others of the round are recorded.
        """
        self._round += 1
        number = self._round
        if number == 1 and self.fingerprint is not None:
            self.fingerprint.prepare()  # beside the first builds, not after the first run
        requests = list(requests)
        numbers = [number] * len(requests)
        failures: dict[int, list[InfrastructureError]] = {i: [] for i in range(len(requests))}
        running: dict[Future[Attempt], int] = {
            self._submit(request, number): i for i, request in enumerate(requests)
        }
        with self._ahead_cond:
            self._announced = None
        results: dict[int, Attempt] = {}
        fatal: InfrastructureError | None = None
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index = running.pop(future)
                request = requests[index]
                try:
                    attempt = future.result()
                except InfrastructureError as exc:
                    reason = str(exc).splitlines()[0]
                    failures[index].append(exc)
                    self._note_infrastructure(request.pypto, request.simpler, reason)
                    if isinstance(exc, DeviceFault):
                        live = len(self.executor.slots)
                        why = reason.removeprefix(f"device {exc.slot.device}: ")
                        self.executor.retire(exc.slot, why)
                        if len(self.executor.slots) < live:  # the report lists it
                            where = placement(exc.slot.device, exc.slot.node)
                            self._note_infrastructure("-", None, f"{RETIRED} {where}: {why}")
                    if len(failures[index]) >= self.infra_retries:
                        fatal = InfrastructureError(
                            _stopping(failures[index], self._moving(request), self._ends)
                        )
                        fatal.__cause__ = exc
                        continue
                    if self.echo:
                        self.echo(
                            f"infrastructure failure, not a verdict (try {len(failures[index])} "
                            f"of {self.infra_retries}): {reason}"
                        )
                    # A fault that lasts a moment (a card still busy, an engine restarting)
                    # must not use up every retry within a second: wait 1, 2, 4... s between.
                    time.sleep(min(RETRY_PAUSE_MAX_S, 2.0 ** (len(failures[index]) - 1)))
                    running[self._submit(request, numbers[index])] = index
                    continue
                self.ledger.record(attempt)
                self._built.update(self._wheels_in(attempt, ("built", "cached")))
                results[index] = attempt
                if done is not None:
                    done(attempt)
                if more is None or fatal is not None:
                    continue
                added, joins = more(attempt, index, sorted(running.values()))
                if not added:
                    continue
                if not joins:  # a round ended: its guesses that finished go on record now
                    self._record_ahead()
                    self._round += 1
                for request in added:
                    failures[len(requests)] = []
                    running[self._submit(request, self._round)] = len(requests)
                    requests.append(request)
                    numbers.append(self._round)
                with self._ahead_cond:
                    self._announced = None
        self._record_ahead()
        if fatal is not None:
            raise fatal
        return [results[i] for i in range(len(requests))]

    def _submit(self, request: Request, number: int) -> Future[Attempt]:
        with self._ahead_cond:
            self._preparing += 1  # until the attempt's builds are done (see `_attempt`)
        return self._pipelines.submit(self._attempt, request, number)

    def _inputs(self, pypto: str, simpler: str | None) -> dict[str, str]:
        """The runtime the pypto wheel of a pair is built with, when not its own pin: a pypto
        whose build reads the runtime's files (its CMake adds a runtime include directory, say)
        compiles them into its wheel, so the pair's state is pypto's code with simpler's files,
        as a commit that only moved the pointer would have. Empty when the build reads none."""
        if simpler is None:
            return {}
        known = self._reads.get(pypto)
        if known is None:  # git, once per pypto commit: the prefetch asks under its lock
            reads = self.exporter.reads_submodule(pypto, self.path)
            known = self._reads[pypto] = (reads, self.exporter.pinned(pypto, self.path))
        reads, pinned = known
        if not reads or pinned in (None, simpler):  # (None: no runtime submodule to move)
            return {}
        return {self.path: simpler}

    def _moving(self, request: Request) -> tuple[str, str]:
        """The commit a test's state stands for, which --skip takes, and how to name the state:
        a simpler commit inside a bump, with pypto pinned at it; else the pypto commit."""
        pypto, simpler = request.pypto, request.simpler
        inside = request.level == "simpler" and simpler is not None
        if inside and self.exporter.pinned(pypto, self.path) != simpler:
            return simpler, self._state(request.level, pypto, simpler)
        return pypto, pypto[:12]

    @staticmethod
    def _state(level: Level, pypto: str, simpler: str | None) -> str:
        """A test's pair as the user knows it: inside a bump, the simpler commit too."""
        if level in ("simpler", "split") and simpler is not None:
            return f"{pypto[:12]} with simpler {simpler[:12]}"
        return pypto[:12]

    def reads_runtime(self, pypto: str) -> None:
        """The session saw that `pypto`'s build reads the runtime's files, which its build files
        do not show (`_inputs`): from now on its wheel for another simpler commit than it pins is
        built with the runtime at that commit."""
        self._reads[pypto] = (True, self.exporter.pinned(pypto, self.path))

    def _wheel_ids(self, pairs: Collection[tuple[str, str | None]]) -> set[tuple[str, str]]:
        """The (package, wheel id) wheels that test `pairs` needs (see `wheel_id`)."""
        pypto = {("pypto", wheel_id(p, self._inputs(p, s))) for p, s in pairs}
        return pypto | {("simpler", s) for _, s in pairs if s is not None}

    def _wheels_in(self, attempt: Attempt, states: Collection[str]) -> list[tuple[str, str]]:
        """(package, wheel id) of the attempt's wheels whose build state is one of `states`."""
        pair = (attempt.pypto_sha, attempt.simpler_sha)
        return [
            wheel
            for package, state in attempt.builds.items()
            if state in states
            for wheel in self._wheel_ids([pair])
            if wheel[0] == package
        ]

    def cached(self, pypto: str, simpler: str | None) -> bool:
        """Whether both wheels of a pair are in the cache already (for cache-aware pivots)."""
        return self._wheel_ids([(pypto, simpler)]) <= self._built

    def prefetch(
        self,
        pairs: Sequence[tuple[str, str | None]],
        testing: Collection[tuple[str, str | None]] = (),
    ) -> int:
        """Build ahead, in the given order (most likely first), while the machine has nothing a
        test waits for to do; returns how many pairs wait for their turn.

        One worker takes the pairs in order: a guess from an earlier round that has not started
        yet is replaced by this round's list, and one already building that neither this list
        nor the round now `testing` names is cancelled. Speculative builds start only while no
        build or test image that a test waits for is under way (then the machine would run the
        examples anyway), queue behind every needed build, land in the cache like any build,
        and are dropped or stopped when the session ends; a later test just finds their wheels.
        """
        if not self.speculate:
            return 0
        pairs = [pair for pair in pairs if self.skip.isdisjoint(pair)]  # never built
        keep = {*pairs, *testing}
        with self._ahead_cond:
            # No guess starts before that round's builds are asked for (test_round, next).
            self._announced = time.monotonic() if testing else None
            kept = self._wheel_ids(keep) - self._yielding(pairs, testing)
        self.executor.drop_guesses(kept)
        with self._ahead_cond:
            # A cancelled guess may be wanted again later.
            self._prefetched = {p for p in self._prefetched & keep if self._wheel_ids([p]) <= kept}
            self._wanted = [pair for pair in pairs if pair not in self._prefetched]
            if self._ahead_worker is None:
                self._ahead_worker = threading.Thread(
                    target=self._prefetch_loop, name="prefetch", daemon=True
                )
                self._ahead_worker.start()
            self._ahead_cond.notify_all()
            return len(self._wanted)

    def _yielding(
        self,
        pairs: Sequence[tuple[str, str | None]],
        testing: Collection[tuple[str, str | None]],
    ) -> set[tuple[str, str]]:
        """Guessed builds that give their build slots to a likelier pair still waiting.

        Guesses take the build slots in the order of the list they came from, but a round's
        outcome reorders the list: a guess two rounds ahead, from an earlier round's list, may
        now hold the slot the next test's wheel needs, and finish after the example that wants
        it. Queued ones of pairs further down the list go back to wait for their turn; running
        ones early in their build (under `YIELD_SHARE` of a typical one) are stopped when the
        free slots are too few. Either is built again in its turn if it is still wanted
        (called under the condition's lock).
        """
        if not self.executor.guesses_compete:
            return set()
        guesses = self.executor.guesses()
        waiting = next(
            (
                i
                for i, pair in enumerate(pairs)
                if pair not in self._prefetched and not self.cached(*pair)
            ),
            None,
        )
        if not guesses or waiting is None:
            return set()
        protected = self._wheel_ids([*pairs[: waiting + 1], *testing])
        queued = {w for w, seconds in guesses.items() if seconds is None and w not in protected}
        missing = self._wheel_ids([pairs[waiting]]) - self._built - guesses.keys()
        free = self.executor.build_jobs - self.executor.busy_builds() + len(queued)
        typical = statistics.median(self._build_times) if self._build_times else None

        def rank(wheel: tuple[str, str]) -> int:
            return next(
                (i for i, pair in enumerate(pairs) if wheel in self._wheel_ids([pair])), len(pairs)
            )

        early = sorted(
            (
                wheel
                for wheel, seconds in guesses.items()
                if wheel not in protected
                and seconds is not None
                and (typical is None or seconds < YIELD_SHARE * typical)
            ),
            key=rank,
            reverse=True,
        )
        return queued | set(early[: max(0, len(missing) - free)])

    def _guess_may_start(self) -> bool:
        """A free build slot and nothing a test waits for under way (called under the
        condition's lock)."""
        # Beside a test's image only once an example has run long enough to hide the guess:
        # before that, nothing says it will not just slow the round on a small machine.
        images = not self._run_times
        if self.executor.guesses_compete and (
            self._tests_busy(images=images) or not self._worth_guessing()
        ):
            return False
        return self.executor.busy_builds() < self.executor.build_jobs

    def _tests_busy(self, images: bool = True) -> bool:
        """Whether a test's own work is under way: its builds, its test image (unless not
        `images`), or a round just announced. Where guesses compete with it
        (`Executor.guesses_compete`), no guessed build starts meanwhile, nor a guessed test
        image while the test's is being made (called under the condition's lock)."""
        announced = self._announced is not None and time.monotonic() - self._announced < 2.0
        return announced or self._preparing > 0 or self.executor.needed_busy(images)

    def _worth_guessing(self) -> bool:
        """Whether examples run long enough to hide builds ahead: a guess starts while the
        round's examples run, and one still building when they end only slows the next round's
        own builds. So guesses stop while the session's median run is shorter than
        `GUESS_RUN_SHARE` of its median build (a fast simulator example, say)."""
        if not self._run_times or not self._build_times:
            return True
        return statistics.median(self._run_times) >= GUESS_RUN_SHARE * statistics.median(
            self._build_times
        )

    def _prefetch_loop(self) -> None:
        """Start each wanted pair's builds when a guess may start, one pair after another, so
        the queue keeps the order the session gave; a thread per pair layers its image."""
        while True:
            with self._ahead_cond:
                while not self._stopping and (not self._wanted or not self._guess_may_start()):
                    self._ahead_cond.wait(0.1)
                if self._stopping:
                    return
                pair = self._wanted.pop(0)
                if pair in self._prefetched:
                    continue
                self._prefetched.add(pair)
            with contextlib.suppress(Exception):
                # Failures are quiet here; the real test meets them again and handles them.
                pypto, simpler = pair
                self._check_sources(pypto, simpler, speculative=True)
                builders = self._builders(pypto, simpler, speculative=True)
                futures = self._submit_wheels(pypto, simpler, builders, speculative=True)
                self._guesses(+1)
                threading.Thread(
                    target=self._ahead_image,
                    args=(pypto, simpler, builders, futures),
                    name="prefetch-image",
                    daemon=True,
                ).start()

    def _ahead_image(
        self,
        pypto: str,
        simpler: str | None,
        builders: Mapping[str, Builder | None],
        futures: Mapping[str, Future[WheelResult]],
    ) -> None:
        """Once a guessed pair's wheels are built, its test image: a speculative test minus the
        run."""
        with contextlib.suppress(Exception):
            try:
                wheels = {name: future.result() for name, future in futures.items()}
            finally:
                self._guesses(-1)
            with self._ahead_cond:
                self._build_times += [w.seconds for w in wheels.values() if not w.from_cache]
            with self._ahead_lock:
                self._ahead += [
                    AheadBuild(
                        package=name,
                        commit=w.commit,
                        ok=w.ok,
                        seconds=round(w.seconds, 3),
                        ccache=[w.ccache_hits, w.ccache_misses]
                        if w.ccache_hits is not None and w.ccache_misses is not None
                        else [],
                        finished_at=_now(),
                    )
                    for name, w in wheels.items()
                    if not w.from_cache
                ]
            if all(w.ok for w in wheels.values()) and "pypto" in wheels:
                self._built.update(self._wheel_ids([(pypto, simpler)]))
                with self._ahead_cond:
                    while (
                        not self._stopping and self.executor.guesses_compete and self._tests_busy()
                    ):
                        self._ahead_cond.wait(0.1)
                    if self._stopping:
                        return
                scratch = self.workdir / "prefetch"
                report = self.executor.run(
                    self._run_job(
                        pypto, simpler, wheels, builders["pypto"], scratch, speculative=True
                    )
                ).result()
                if report.image_id:  # (Ray layers where the run lands, not ahead)
                    with self._ahead_lock:
                        self._ahead_images.append(report.image_id)

    def _guesses(self, change: int) -> None:
        with self._ahead_lock:
            self._guessing += change
            count = self._guessing
        with contextlib.suppress(Exception):  # the progress line must not stop a build
            self.ahead(count)

    # -- one attempt (a pipeline thread) ---------------------------------------------------

    def _note_infrastructure(self, pypto: str, simpler: str | None, reason: str) -> None:
        """Kept beside the ledger, never in it: the user may want to know what went wrong."""
        log = self.workdir / INFRASTRUCTURE_LOG
        with contextlib.suppress(OSError), log.open("a") as handle:
            handle.write(f"{_now().isoformat()} {pypto} {simpler or '-'} {reason}\n")

    def _attempt(self, request: Request, number: int) -> Attempt:
        pypto, simpler = request.pypto, request.simpler
        with self._claim:
            run_id, artifacts = claim_run_dir(
                self.workdir / "runs",
                f"{pypto[:10]}-{(simpler or 'none')[:10]}",
                taken=[
                    *(attempt.run_id for attempt in self.ledger.document.attempts),
                    *self._claimed,
                ],
            )
            self._claimed.append(run_id)
        record = Attempt(
            run_id=run_id,
            level=request.level,
            pypto_sha=pypto,
            simpler_sha=simpler,
            verdict=Verdict.SKIP,
            artifacts_dir=str(artifacts),
            round=number,
            started_at=_now(),
            finished_at=_now(),
        )
        prepared = False

        def builds_done() -> None:
            nonlocal prepared
            if not prepared:
                prepared = True
                with self._ahead_cond:
                    self._preparing -= 1
                    self._ahead_cond.notify_all()

        skipped = [sha for sha in (pypto, simpler) if sha in self.skip]
        if skipped:  # nothing to build or run: the user said it cannot be judged
            builds_done()
            which = "pypto" if skipped[0] == pypto else "simpler"
            record.reason = f"{USER_SKIP} (the {which} commit {skipped[0][:12]})"
            record.finished_at = _now()
            return record
        try:
            self._build_and_run(record, artifacts, builds_done)
        except (SourceUnavailable, WheelInstallFailed) as exc:
            record.verdict = Verdict.SKIP
            record.reason = str(exc).splitlines()[0]
        finally:
            builds_done()
        if self.fingerprint is not None:
            # The node's own facts (a Ray node) win over the driver host's.
            node = record.fingerprint
            record.fingerprint = {**self.fingerprint(record.image_id, record.device or ""), **node}
        record.finished_at = _now()
        return record

    def _check_sources(
        self,
        pypto: str,
        simpler: str | None,
        speculative: bool = False,
        omitted: set[str] | None = None,
    ) -> None:
        """Every source a pair needs must exist before anything is built for it."""
        overrides: dict[str, str | None] = {self.path: simpler} if simpler is not None else {}
        with self._git.turn(speculative):
            self.exporter.check(pypto, overrides=overrides, skip=self.omit, omitted=omitted)

    def _builders(
        self, pypto: str, simpler: str | None, speculative: bool = False
    ) -> dict[str, Builder | None]:
        """The builder of each package of a pair (None without toolchains)."""
        builders: dict[str, Builder | None] = {"pypto": None}
        if simpler is not None:
            builders["simpler"] = None
        if self.toolchains is not None:
            with self._git.turn(speculative):
                # A guess's builders say nothing of what the test under way waits for.
                show = not speculative
                for package, commit, at in (("pypto", pypto, None), ("simpler", simpler, pypto)):
                    if commit is None:
                        continue
                    try:
                        builders[package] = self.toolchains.builder(package, commit, at, show=show)
                    except BadInput as exc:  # (a commit inside a bump, which the plan skips)
                        raise skippable(exc, commit, self._ends) from None
        return builders

    def _wheels(
        self, pypto: str, simpler: str | None, builders: Mapping[str, Builder | None]
    ) -> dict[str, WheelResult]:
        """Both wheels of a pair, built at once."""
        futures = self._submit_wheels(pypto, simpler, builders)
        return {name: future.result() for name, future in futures.items()}

    def _submit_wheels(
        self,
        pypto: str,
        simpler: str | None,
        builders: Mapping[str, Builder | None],
        *,
        speculative: bool = False,
    ) -> dict[str, Future[WheelResult]]:
        """Queue both wheels of a pair (simpler first)."""
        jobs: list[BuildJob] = []
        if simpler is not None:
            jobs.append(
                self._job(
                    "simpler",
                    simpler,
                    lambda dest: self.exporter.export_submodule(
                        self.path, simpler, dest, at=pypto, skip=self.omit
                    ),
                    builders["simpler"],
                    speculative,
                )
            )
        with self._git.turn(speculative):
            inputs = self._inputs(pypto, simpler)
        jobs.append(
            self._job(
                "pypto",
                pypto,
                lambda dest: self.exporter.export(pypto, dest, overrides=inputs, skip=self.omit),
                builders["pypto"],
                speculative,
                inputs,
            )
        )
        futures = {job.package: self.executor.build(job) for job in jobs}
        if not speculative:
            # The builds the test waits for, both when they run side by side, not a wheel built
            # already (the phase named the last job, a cached pypto while simpler built).
            waiting = [job for job in jobs if job.wheel not in self._built]
            if waiting:
                self._phase_builds(waiting, futures)
        return futures

    def _phase_builds(
        self, waiting: list[BuildJob], futures: Mapping[str, Future[WheelResult]]
    ) -> None:
        """Name the builds the test waits for, and only those left as each one ends."""

        def label(jobs: list[BuildJob]) -> str:
            return "build " + " and ".join(f"{job.package} {job.commit[:12]}" for job in jobs)

        shown = label(waiting)
        self.phase(shown)

        def narrow(_done: Future[WheelResult]) -> None:
            left = [job for job in waiting if not futures[job.package].done()]
            if left:
                self.phase(label(left), unless_moved_from=shown)

        if len(waiting) > 1:
            for job in waiting:
                futures[job.package].add_done_callback(narrow)

    def phase(self, name: str, *, unless_moved_from: str | None = None) -> None:
        """Show what the test is doing. `unless_moved_from`: only while that is still shown (a
        build ending on another thread narrows its label, not a phase that came after it)."""
        with self._phase_lock:
            if unless_moved_from is not None and self._phase_shown != unless_moved_from:
                return
            self._phase_shown = name
            self._show_phase(name)

    def _job(
        self,
        package: str,
        commit: str,
        export: Callable[[Path], object],
        builder: Builder | None,
        speculative: bool,
        inputs: Mapping[str, str] | None = None,
    ) -> BuildJob:
        def prepare(dest: Path) -> object:
            with self._git.turn(speculative):
                return export(dest)

        ccache = self.ccache_dir / package  # one cache per repository, shared by all its builds
        ccache.mkdir(parents=True, exist_ok=True)
        return BuildJob(
            package=package,
            commit=commit,
            prepare=prepare,
            settings=self.build,
            builder=builder,
            ccache_dir=ccache,
            speculative=speculative,
            inputs=dict(inputs or {}),
        )

    def _run_job(
        self,
        pypto: str,
        simpler: str | None,
        wheels: Mapping[str, WheelResult],
        builder: Builder | None,
        artifacts: Path,
        *,
        speculative: bool = False,
    ) -> RunJob:
        """`builder`: pypto's, whose pip wheel installs the wheels into a base without pip."""
        pypto_wheel = wheels["pypto"].wheel
        assert pypto_wheel is not None
        # A pypto commit already in an image is pinned while simpler moves: share its layer.
        pypto_first = pypto in self._layered
        self._layered.add(pypto)
        return RunJob(
            pypto=pypto,
            simpler=simpler,
            pypto_wheel=pypto_wheel,
            simpler_wheel=wheels["simpler"].wheel if simpler is not None else None,
            pip_wheel=builder.pip_wheel if builder else None,
            base_image=self.build.base_image,
            base_image_id=self.build.base_image_id,
            speculative=speculative,
            pypto_first=pypto_first,
            run=ExampleRun(
                image="",
                lib_dir=self.run.lib_dir,
                script=self.run.script,
                platform=self.run.platform,
                device=self.run.device,
                artifacts_dir=artifacts,
                passthrough=self.run.passthrough,
                extra_args=list(self.run.extra_args),
                python=self.run.python,
                environment=dict(self.run.environment),
                ptoas_root=self.run.ptoas_root,
                pto_isa_root=self.run.pto_isa_root,
                cpus=self.run.cpus,
                memory=self.run.memory,
                timeout=self.run.timeout,
            ),
        )

    def _build_and_run(
        self, record: Attempt, artifacts: Path, builds_done: Callable[[], None]
    ) -> None:
        """`builds_done()` is called once the executor has the run (and counts its image)."""
        pypto, simpler = record.pypto_sha, record.simpler_sha
        self.phase("sources")
        self._check_sources(pypto, simpler)
        try:
            builders = self._builders(pypto, simpler)
        except UnbuildableCommit as exc:
            # The commit's own build configuration is broken: no build could start.
            record.verdict = Verdict.SKIP
            record.reason = f"build failed: {exc.package} ({exc.detail})"
            return
        for name, builder in builders.items():
            if builder is not None:
                record.builders[name] = builder.image_id
                record.build_tools[name] = list(builder.tools)
        began = time.monotonic()
        wheels = self._wheels(pypto, simpler, builders)
        # What the test waited for its wheels: two builds side by side count once.
        record.build_s = time.monotonic() - began
        for name in ("simpler", "pypto"):
            wheel = wheels.get(name)
            if wheel is None:
                continue
            record.builds[name] = _build_state(wheel)
            if wheel.ok:  # a wheel the next test needs no phase for, whatever this test gives
                self._built.update(w for w in self._wheel_ids([(pypto, simpler)]) if w[0] == name)
            record.export_s += wheel.export_s
            if wheel.ccache_hits is not None and wheel.ccache_misses is not None:
                record.ccache[name] = [wheel.ccache_hits, wheel.ccache_misses]
            if wheel.sha256:
                record.wheel_digests[name] = wheel.sha256
            if wheel.ok and wheel.wheel is not None:
                with contextlib.suppress(OSError, zipfile.BadZipFile):
                    record.wheel_contents[name] = wheel_content_digest(wheel.wheel)
            if not wheel.from_cache:
                with self._ahead_cond:
                    self._build_times.append(wheel.seconds)
            if not wheel.ok:
                record.verdict = Verdict.SKIP
                record.reason = f"build failed: {name} ({wheel.reason or 'see the build log'})"
                record.log_path = str(wheel.log_path)
                # Beside the attempt, where the report points: the cache's copy may be pruned.
                kept = artifacts / f"build-{name}.log"
                with contextlib.suppress(OSError):
                    shutil.copyfile(wheel.log_path, kept)
                    record.log_path = str(kept)
                return

        self.phase("run")
        job = self._run_job(pypto, simpler, wheels, builders["pypto"], artifacts)
        running = self.executor.run(job)
        builds_done()
        try:
            report = running.result()
        except WheelInstallFailed as exc:
            wheel = wheels.get(exc.package)
            if wheel is not None and wheel.from_cache and self.cache.discard_if_damaged(wheel):
                raise InfrastructureError(
                    f"the cached {exc.package} wheel of {exc.commit[:12]} was damaged after it "
                    "was built (its sha256 no longer matches): removed from the cache, it is "
                    "built again; not a verdict"
                ) from None
            raise
        result = report.result
        assert result is not None and report.slot is not None
        record.build_s += report.image_s
        record.image_id = report.image_id
        record.device = report.slot.device
        record.node = report.slot.node
        record.fingerprint = dict(report.facts)
        outcome = judge(
            result.exit_code,
            result.output,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            timeout_s=self.run.timeout,
            patterns=self.run.patterns,
        )
        # A mismatch after a device or disk fault compared garbage: no verdict either (a run
        # that passed computed right whatever it logged).
        if outcome.verdict is not Verdict.GOOD:
            fault = infrastructure_fault(
                result.exit_code,
                result.output,
                timed_out=result.timed_out,
                oom_killed=result.oom_killed,
            )
            if result.oom_killed and self.run.memory:
                fault = f"ran out of memory under its {self.run.memory} limit (--memory)"
            if fault is not None:
                message = (
                    f"the example run of {self._state(record.level, pypto, simpler)} on device "
                    f"{report.slot.device} {fault}; not a verdict (log: {result.log_path})"
                )
                if stopped(
                    result.exit_code, timed_out=result.timed_out, oom_killed=result.oom_killed
                ):
                    # The commit's run, not the card: another card would see the same.
                    raise ExampleStopped(message, timed_out=result.timed_out)
                raise DeviceFault(message, report.slot)
        record.verdict = outcome.verdict
        record.reason = outcome.reason
        record.metrics = dict(outcome.metrics)
        record.exit_code = result.exit_code
        record.run_s = result.seconds
        with self._ahead_cond:
            self._run_times.append(result.seconds)
        record.log_path = str(result.log_path)


def _stopping(
    failures: Sequence[InfrastructureError],
    moving: tuple[str, str],
    ends: Collection[str | None] = (),
) -> str:
    """Why the run stops after a test's infrastructure failures, and what lets it go on.

    `moving`: the commit the test's state stands for (`DockerTester._moving`) and how to name
    the state; `ends`: the range's ends and the simpler commits they pin, which --skip cannot
    take."""
    commit, state = moving
    count, last = len(failures), failures[-1]
    if isinstance(last, BuildTimedOut) and all(isinstance(f, BuildTimedOut) for f in failures):
        hangs = (
            "move --good or --bad off it (it is an end of the range)"
            if last.commit in ends
            else f"run again with --skip {last.commit[:12]} to take it as untestable"
        )
        return (
            f"the {last.package} build of {last.commit[:12]} timed out after {last.seconds:g}s "
            f"{'twice' if count == 2 else f'{count} times' if count > 2 else 'once'}"
            f"{' in a row' if count > 1 else ''}, nothing recorded (log: {last.log}): raise "
            "--build-timeout if builds are only slow here, or, if this commit's build hangs, "
            + hangs
        )
    in_a_row = f"{count} infrastructure failure{'s' if count > 1 else ''} in a row"
    what = "fix the cause and run again to resume"
    if isinstance(last, ExampleStopped):
        around = (
            "move --good or --bad off it (it is an end of the range)"
            if commit in ends
            else f"run again with --skip {commit[:12]} to take it as untestable"
        )
        what = (
            f"raise --timeout if the example is only slow here, or, if it hangs at this commit, "
            f"{around}"
            if last.timed_out
            else "give the example more memory (--memory, or a host with more), or, if it is "
            f"killed at this commit whatever it gets, {around}"
        )
    first = str(last).splitlines()[0]
    return f"{in_a_row}, nothing recorded for {state}: {first}; {what}"


def _build_state(wheel: WheelResult) -> str:
    if wheel.ok:
        return "cached" if wheel.from_cache else "built"
    return "failed-cached" if wheel.from_cache else "failed"
