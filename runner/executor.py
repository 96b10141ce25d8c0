"""Where builds and example runs happen: the one interface the session's scheduler talks to.

A bisect step needs two wheel builds (CPU for minutes) and one example run (a device for as
long as the example takes). The scheduler decides *what* to build and run; an executor decides
*where* and *when*: it owns the CPU slots for builds and the device slots for runs, so builds can
overlap runs and several devices can each run one test per round.

Two implementations share this interface: `LocalExecutor` (threads and this host's Docker
Engine) and the Ray executor (`runner/ray_executor.py`, tasks on a cluster whose nodes each
have a Docker Engine). The contract both keep:

- `build(job)` returns a future of the `WheelResult`; wheels land in the content-addressed
  `WheelCache`, so a build is done once whoever asks for it, and a speculative build that turns
  out to be needed is simply waited for. Every caller gets a future of its own
  (`SharedBuild`): the one that owns the build sees it built, the others see a cache hit, so a
  build is counted once. Sources are exported *on the driver* by `job.prepare`.
- `run(job)` returns a future of the `RunReport`: the executor picks a free device slot, layers
  the test image where the run happens, runs the example and says which slot ran it.
- Infrastructure faults raise `InfrastructureError` from the future; a failing device is taken
  out of the pool with `retire`; nothing an executor does is a verdict by itself (the tester
  judges, the driver alone writes the ledger).
- `close(cancel=True)` drops queued work and stops running containers; nothing half-written is
  ever left where a later step could use it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import docker

from runner.builders import Builder
from runner.containers import ContainerResult
from runner.devices import Passthrough
from runner.errors import InfrastructureError
from runner.execute import Cancelled, ExampleRun, run_example
from runner.images import ensure_test_image
from runner.ledger import LOCAL_NODE
from runner.wheels import BuildSettings, WheelCache, WheelResult, build_wheel, wheel_id

Echo = Callable[[str], None]
_BUILD_MEMORY_GIB = 6  # what one C++17 pypto build may take at its peak (nanobind TUs)
_NEEDED, _SPECULATIVE = 0, 1  # build priorities: a build a test waits for goes first


@dataclass(frozen=True, eq=False)
class Slot:
    """One place an example can run: a device (or a simulator lane) on a node.

    Slots compare by identity: a pool holds each once, and two cards with equal settings are
    still two places to run.
    """

    device: str  # the card(s) the example gets, as --device names them ("0", "2,3")
    passthrough: Passthrough = field(default_factory=Passthrough)
    cpus: float | None = None  # simulator lanes: the CPU limit of each container
    node: str = LOCAL_NODE


@dataclass
class BuildJob:
    package: str
    commit: str
    prepare: Callable[[Path], object]  # exports the sources into an empty directory (driver)
    settings: BuildSettings
    builder: Builder | None
    ccache_dir: Path
    speculative: bool = False
    # Submodules `prepare` exports at another commit than `commit` pins (path -> sha): part of
    # the wheel's cache key (`WheelCache.key`).
    inputs: Mapping[str, str] = field(default_factory=dict)

    @property
    def wheel(self) -> tuple[str, str]:
        """(package, wheel id): which wheel this builds, as the session names it."""
        return self.package, wheel_id(self.commit, self.inputs)

    @property
    def key_args(self) -> tuple[str, str, BuildSettings, str | None, Mapping[str, str]]:
        """What the wheel cache keys this build by."""
        builder = self.builder.key if self.builder else None
        return self.package, self.commit, self.settings, builder, self.inputs


@dataclass
class RunJob:
    """One example run: the image's ingredients and the run's settings, minus the device."""

    pypto: str
    simpler: str | None
    pypto_wheel: Path
    simpler_wheel: Path | None
    pip_wheel: Path | None
    base_image: str
    base_image_id: str
    run: ExampleRun  # device, passthrough and cpus are the slot's
    speculative: bool = False  # only layer the image (a prefetch): no device, no run
    pypto_first: bool = False  # pypto's wheel is the layer earlier images share


@dataclass
class RunReport:
    result: ContainerResult | None  # None for a speculative job (image only)
    image_id: str
    image_s: float
    slot: Slot | None
    # Fingerprint facts of the node that ran it (kernel, driver, npu-smi), when not this host.
    facts: dict[str, str] = field(default_factory=dict)


class SharedBuild:
    """One build several callers asked for, each with a future of its own.

    The build belongs to the first caller that needs it (a test), else to the first caller (a
    guess): its future gets the result as it is. Every other caller, and any caller that
    attaches after the build finished, gets the same wheel as a cache hit (``from_cache``), just
    as if it had asked a moment later. So a build two tests waited for counts as built once, and
    a guess a test overtook is not recorded as built ahead. A failure reaches every caller.
    """

    def __init__(self, build: Future[WheelResult]) -> None:
        self.build = build  # the one build: its owner sets the result
        self._lock = threading.Lock()
        self._waiters: list[tuple[Future[WheelResult], bool]] = []
        self._settled = False
        build.add_done_callback(self._settle)

    def attach(self, *, speculative: bool) -> Future[WheelResult]:
        future: Future[WheelResult] = Future()
        with self._lock:
            if not self._settled:
                self._waiters.append((future, speculative))
                return future
        self._resolve(future, owner=False)
        return future

    def _settle(self, build: Future[WheelResult]) -> None:
        with self._lock:
            self._settled = True
            waiters, self._waiters = self._waiters, []
        needed = [f for f, speculative in waiters if not speculative]
        owner = needed[0] if needed else waiters[0][0] if waiters else None
        for future, _ in waiters:
            self._resolve(future, owner=future is owner)

    def _resolve(self, future: Future[WheelResult], *, owner: bool) -> None:
        build = self.build
        if build.cancelled():
            future.set_exception(Cancelled("the build was cancelled"))
        elif (exc := build.exception()) is not None:
            future.set_exception(exc)
        else:
            result = build.result()
            future.set_result(result if owner else replace(result, from_cache=True))


class Executor(ABC):
    """Builds and runs for one session; see the module docstring for the contract."""

    name: str = "executor"
    # Whether builds ahead of need share one machine with the tests' own builds and images
    # (then a guess waits until they are done) or run on capacity nobody else asked for.
    guesses_compete: bool = False

    @property
    @abstractmethod
    def slots(self) -> Sequence[Slot]:
        """The device slots still in the pool: how many tests one round can run."""

    @property
    @abstractmethod
    def build_jobs(self) -> int:
        """How many builds can run at once."""

    @abstractmethod
    def build(self, job: BuildJob) -> Future[WheelResult]: ...

    @abstractmethod
    def run(self, job: RunJob) -> Future[RunReport]: ...

    @abstractmethod
    def retire(self, slot: Slot, reason: str) -> None:
        """Take a slot out of the pool after an infrastructure fault on it."""

    @abstractmethod
    def busy_builds(self) -> int:
        """Builds queued or running now (speculative ones included)."""

    @abstractmethod
    def close(self, *, cancel: bool) -> None:
        """Stop accepting work; with `cancel`, drop queued work and stop running containers."""

    def needed_busy(self, images: bool = True) -> bool:
        """Whether work a test waits for (a build; a test image, unless not `images`) is under
        way, when `guesses_compete`."""
        return False

    def drop_guesses(self, keep: Collection[tuple[str, str]]) -> None:
        """Cancel speculative builds of (package, commit) wheels not in `keep`: they would only
        compete with the tests now running. Nothing of theirs reaches the cache. By default
        guesses run on: where they do not share a machine with the tests, they only cost
        capacity nobody asked for."""
        return None

    def guesses(self) -> dict[tuple[str, str], float | None]:
        """Speculative builds queued (None) or under way (seconds since each started), by
        (package, commit), where they hold build slots a likelier guess could use
        (`guesses_compete`)."""
        return {}

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)


def default_build_jobs(cores: int | None = None, memory_gib: float | None = None) -> int:
    """Builds at once: at least two (one needed, one ahead) when memory allows, one per eight
    cores on big hosts, never more than memory holds at a build's peak."""
    cores = cores or os.cpu_count() or 1
    if memory_gib is None:
        memory_gib = _memory_gib()
    by_memory = max(1, int(memory_gib // _BUILD_MEMORY_GIB))
    return max(1, min(max(2, cores // 8), by_memory))


def build_parallelism(jobs: int, cores: int | None = None) -> int:
    """Compile jobs per build: the cores shared out among the builds, at least two each."""
    cores = cores or os.cpu_count() or 1
    return max(2, cores // max(1, jobs))


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 8.0


class DeviceFault(InfrastructureError):
    """The example could not run on this slot (aclInit, a busy or missing card)."""

    def __init__(self, message: str, slot: Slot) -> None:
        super().__init__(message)
        self.slot = slot

    def __reduce__(self) -> tuple[type, tuple[str, Slot]]:  # raised by a Ray task
        return type(self), (str(self), self.slot)


class _DevicePool:
    """Free slots; a retired slot never comes back, and the last live one is never retired."""

    def __init__(self, slots: Sequence[Slot], warn: Echo | None) -> None:
        self._all = list(slots)
        self._free = list(slots)
        self._retired: dict[Slot, str] = {}
        self._cond = threading.Condition()
        self._warn = warn
        self._closed = False

    @property
    def live(self) -> list[Slot]:
        with self._cond:
            return [s for s in self._all if s not in self._retired]

    def take(self, cancel: threading.Event) -> Slot:
        with self._cond:
            while True:
                if self._closed or cancel.is_set():
                    raise Cancelled("the session is stopping")
                if self._free:
                    return self._free.pop(0)
                self._cond.wait(0.5)

    def give_back(self, slot: Slot) -> None:
        with self._cond:
            if slot not in self._retired:
                self._free.append(slot)
            self._cond.notify_all()

    def retire(self, slot: Slot, reason: str) -> None:
        with self._cond:
            live = [s for s in self._all if s not in self._retired]
            if slot not in live or len(live) == 1:
                # The last device stays: the tester's retries decide when to give up.
                return
            self._retired[slot] = reason
            with contextlib.suppress(ValueError):
                self._free.remove(slot)
            self._cond.notify_all()
        if self._warn:
            self._warn(f"device {slot.device} taken out of the pool: {reason}")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass(order=True)
class _Queued:
    priority: int
    order: int
    job: BuildJob = field(compare=False)
    key: str = field(compare=False)
    shared: SharedBuild = field(compare=False)
    cancel: threading.Event = field(compare=False, default_factory=threading.Event)
    started_at: float | None = field(compare=False, default=None)  # monotonic

    @property
    def started(self) -> bool:
        return self.started_at is not None


class LocalExecutor(Executor):
    """Threads on this host: `build_jobs` build workers, one run at a time per device slot."""

    name = "local"

    def __init__(
        self,
        client: docker.DockerClient,
        cache: WheelCache,
        slots: Sequence[Slot],
        *,
        build_jobs: int | None = None,
        echo: Echo | None = None,
        warn: Echo | None = None,
    ) -> None:
        """`echo` streams build and run logs (--verbose); `warn` says what the user must know
        (a card leaving the pool), verbose or not."""
        if not slots:
            raise ValueError("an executor needs at least one device slot")
        self.client = client
        self.cache = cache
        self.echo = echo
        self._jobs = build_jobs or default_build_jobs()
        # A round's own builds (two per test) can fill every build slot: guesses must yield.
        # On a host with slots to spare they use those at any time.
        self.guesses_compete = self._jobs <= 2 * len(slots)
        self._pool = _DevicePool(slots, warn or echo)
        self._lock = threading.Lock()
        self._queue: list[_Queued] = []
        self._by_key: dict[str, _Queued] = {}
        self._wake = threading.Condition(self._lock)
        self._order = itertools.count()
        self._closed = False
        self._stop = threading.Event()  # set by close(cancel=True): running work stops
        self._running = 0
        self._running_needed = 0
        self._imaging = 0  # needed runs whose test image is being made
        # Needed builds have `build_jobs` slots of their own; speculative ones only fill slots
        # nobody uses (at a small CPU weight), so a test never waits behind a guess.
        self._workers = [
            threading.Thread(target=self._build_worker, name=f"build-{i}", daemon=True)
            for i in range(2 * self._jobs)
        ]
        for worker in self._workers:
            worker.start()
        self._runs: list[threading.Thread] = []

    # -- the interface ---------------------------------------------------------------------

    @property
    def slots(self) -> Sequence[Slot]:
        return self._pool.live

    @property
    def build_jobs(self) -> int:
        return self._jobs

    def busy_builds(self) -> int:
        with self._lock:
            return self._running + len(self._queue)

    def build(self, job: BuildJob) -> Future[WheelResult]:
        key = self.cache.key(*job.key_args)
        priority = _SPECULATIVE if job.speculative else _NEEDED
        with self._lock:
            if self._closed:
                future: Future[WheelResult] = Future()
                future.set_exception(Cancelled("the session is stopping"))
                return future
            queued = self._by_key.get(key)
            if queued is not None and not queued.cancel.is_set():
                if priority < queued.priority and not queued.started:
                    # Needed now: move it to the front of the queue.
                    queued.priority = priority
                    heapq.heapify(self._queue)
                if not job.speculative:
                    queued.job.speculative = False
                return queued.shared.attach(speculative=job.speculative)
            queued = _Queued(priority, next(self._order), job, key, SharedBuild(Future()))
            self._by_key[key] = queued
            heapq.heappush(self._queue, queued)
            self._wake.notify_all()
            return queued.shared.attach(speculative=job.speculative)

    def run(self, job: RunJob) -> Future[RunReport]:
        future: Future[RunReport] = Future()
        thread = threading.Thread(
            target=self._run_worker, args=(job, future), name="run", daemon=True
        )
        with self._lock:
            if self._closed:
                future.set_exception(Cancelled("the session is stopping"))
                return future
            self._runs = [t for t in self._runs if t.is_alive()]
            self._runs.append(thread)
            # Counted from the call on, so no guess starts between it and the thread's start.
            self._imaging += not job.speculative
        thread.start()
        return future

    def retire(self, slot: Slot, reason: str) -> None:
        self._pool.retire(slot, reason)

    def needed_busy(self, images: bool = True) -> bool:
        with self._lock:
            return self._needed_busy(images)

    def _needed_busy(self, images: bool = True) -> bool:
        queued = any(q.priority == _NEEDED for q in self._queue)
        return queued or self._running_needed > 0 or (images and self._imaging > 0)

    def guesses(self) -> dict[tuple[str, str], float | None]:
        now = time.monotonic()
        with self._lock:
            return {
                q.job.wheel: None if q.started_at is None else now - q.started_at
                for q in self._by_key.values()
                if q.job.speculative and not q.cancel.is_set()
            }

    def drop_guesses(self, keep: Collection[tuple[str, str]]) -> None:
        wanted = set(keep)
        with self._lock:
            stale = [
                q
                for q in self._by_key.values()
                if q.job.speculative and q.job.wheel not in wanted and not q.cancel.is_set()
            ]
            for queued in stale:
                queued.cancel.set()  # a running one's container is killed, nothing cached
                del self._by_key[queued.key]
            waiting = [q for q in stale if not q.started]
            self._queue = [q for q in self._queue if q not in waiting]
            heapq.heapify(self._queue)
            self._wake.notify_all()
        for queued in waiting:
            queued.shared.build.set_exception(Cancelled("no longer a likely next test"))

    def close(self, *, cancel: bool) -> None:
        with self._lock:
            self._closed = True
            dropped = []
            for queued in self._queue:
                if not queued.started and (cancel or queued.job.speculative):
                    dropped.append(queued)
            self._queue = [q for q in self._queue if q not in dropped]
            heapq.heapify(self._queue)
            for queued in self._by_key.values():
                if queued.started and (cancel or queued.job.speculative):
                    queued.cancel.set()  # the build's container is killed, nothing cached
            self._wake.notify_all()
        for queued in dropped:
            self._by_key.pop(queued.key, None)
            queued.shared.build.set_exception(Cancelled("the session stopped before this build"))
        if cancel:
            self._stop.set()
        self._pool.close()
        for thread in [*self._workers, *self._runs]:
            thread.join(timeout=60)

    # -- workers ---------------------------------------------------------------------------

    def _build_worker(self) -> None:
        while True:
            with self._lock:
                while not self._startable() and not (self._closed and not self._queue):
                    self._wake.wait()
                if not self._queue:
                    return
                queued = heapq.heappop(self._queue)
                queued.started_at = time.monotonic()
                self._running += 1
                needed = queued.priority == _NEEDED
                self._running_needed += needed
            try:
                result = build_wheel(
                    self.client,
                    self.cache,
                    queued.job.package,
                    queued.job.commit,
                    queued.job.prepare,
                    queued.job.settings,
                    ccache_dir=queued.job.ccache_dir,
                    builder=queued.job.builder,
                    echo=None if queued.job.speculative else self.echo,
                    cancel=queued.cancel,
                    parallel=build_parallelism(self._jobs),
                    inputs=queued.job.inputs,
                    speculative=queued.job.speculative,
                )
            except BaseException as exc:
                queued.shared.build.set_exception(exc)
            else:
                queued.shared.build.set_result(result)
            finally:
                with self._lock:
                    self._running -= 1
                    self._running_needed -= needed
                    if self._by_key.get(queued.key) is queued:
                        del self._by_key[queued.key]
                    self._wake.notify_all()

    def _startable(self) -> bool:
        """Whether the head of the queue may start now (called with the lock held)."""
        if not self._queue:
            return False
        if self._queue[0].priority == _NEEDED:
            return self._running_needed < self._jobs
        # A guess waits for needed builds to finish: it would slow exactly what a test waits
        # for. Not for a test image: mostly the engine's I/O, it leaves a core to the guess,
        # which then is ready that much sooner for the round after.
        return self._running < self._jobs and not (
            self.guesses_compete and self._needed_busy(images=False)
        )

    def _run_worker(self, job: RunJob, future: Future[RunReport]) -> None:
        try:
            future.set_result(self._run(job))
        except BaseException as exc:
            future.set_exception(exc)

    def _run(self, job: RunJob) -> RunReport:
        imaging = not job.speculative  # counted by run()

        def image_made() -> None:
            nonlocal imaging
            if imaging:
                with self._lock:
                    self._imaging -= 1
                    self._wake.notify_all()  # a guess may start now
                imaging = False

        def take() -> Slot:
            image_made()
            return self._pool.take(self._stop)

        try:
            return run_on_node(
                self.client, job, take, self._pool.give_back, self._stop, echo=self.echo
            )
        finally:
            image_made()


def run_on_node(
    client: docker.DockerClient,
    job: RunJob,
    take: Callable[[], Slot],
    give_back: Callable[[Slot], None],
    cancel: threading.Event,
    *,
    echo: Echo | None = None,
) -> RunReport:
    """Layer the test image on this node, then run the example on a slot taken from `take`.

    The image is layered before a slot is taken, so no device idles while pip installs wheels.
    """
    started = time.monotonic()
    image = ensure_test_image(
        client,
        base_image=job.base_image,
        base_image_id=job.base_image_id,
        pypto_sha=job.pypto,
        pypto_wheel=job.pypto_wheel,
        simpler_sha=job.simpler,
        simpler_wheel=job.simpler_wheel,
        log_path=job.run.artifacts_dir / "image.log",
        echo=None if job.speculative else echo,
        pip_wheel=job.pip_wheel,
        speculative=job.speculative,
        pypto_first=job.pypto_first,
        python=job.run.python,
    )
    image_s = time.monotonic() - started
    if job.speculative:
        return RunReport(result=None, image_id=image.image_id, image_s=image_s, slot=None)
    slot = take()
    try:
        run = replace(
            job.run,
            image=image.image_id,
            device=slot.device,
            passthrough=slot.passthrough,
            cpus=slot.cpus if slot.cpus is not None else job.run.cpus,
        )
        try:
            result = run_example(client, run, echo=echo, cancel=cancel)
        except InfrastructureError as exc:
            inside: dict[str, str] = {}  # each device's host node: its path in the container
            for device in slot.passthrough.devices:  # "HOST[:CONTAINER[:PERMISSIONS]]"
                host, _, rest = device.partition(":")
                inside[host] = rest.partition(":")[0] or host
            gone = [host for host in inside if f'"{host}"' in str(exc) or f"{host}:" in str(exc)]
            cards = {f"/dev/davinci{card.strip()}" for card in slot.device.split(",")}
            own = {host for host, node in inside.items() if node in cards}
            if gone and set(gone) <= own:
                # The engine could not hand this card's device node over (it left the host).
                raise DeviceFault(f"device {slot.device}: {exc}", slot) from exc
            if gone:  # a control node or a --device-map node: every device's containers get it
                raise InfrastructureError(
                    f"device node {gone[0]}, which every device's containers get, is not on "
                    f"the host: {exc}"
                ) from exc
            raise
    finally:
        give_back(slot)
    return RunReport(result=result, image_id=image.image_id, image_s=image_s, slot=slot)
