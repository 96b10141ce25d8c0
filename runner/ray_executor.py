"""Builds and example runs as tasks on a Ray cluster: one bisect uses every free card of a pool.

The driver (the `run` command) keeps everything that decides or records: the session, the ledger,
the source exports, the wheel cache. Nodes only execute, each in its own Docker Engine:

- A build is a CPU task on any node. Its sources are exported on the driver and reach the node as
  a tarball in the object store (nodes never clone anything). The wheel comes back into the
  driver's content-addressed cache, so a commit is built once per cluster; when the nodes see the
  driver's cache directory (``--cache-dir`` on shared storage) they build straight into it.
- A run is a task that asks Ray for `cards_per_test` ``NPU`` (Ray sets
  ``ASCEND_RT_VISIBLE_DEVICES`` and tells the task which cards it got), or for CPUs on simulator
  platforms. It layers the test image on its node, passes the cards through in the configured
  device mode, runs the example and ships the run folder back to the driver.
- A node or worker lost mid-task is retried by Ray on another node; when the retries run out the
  driver sees an `InfrastructureError`, which the tester retries and never records as a verdict.

Ray is imported only when this executor is made: the core package never needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
from filelock import FileLock
from platformdirs import user_cache_dir

from runner.builders import Builder, find_builder, image_present
from runner.devices import DeviceMode, is_simulator, passthrough
from runner.errors import BadInput, BisectError, InfrastructureError
from runner.execute import (
    Cancelled,
    connect,
    pid_answers,
    remove_own_containers,
    remove_stale_containers,
)
from runner.executor import (
    BuildJob,
    Executor,
    RunJob,
    RunReport,
    SharedBuild,
    Slot,
    run_on_node,
)
from runner.fingerprint import host_facts
from runner.sources import ExportResult
from runner.verdict import truncate
from runner.wheels import BuildSettings, WheelCache, WheelResult, build_wheel

if TYPE_CHECKING:
    from runner.prepare import Prepared

Echo = Callable[[str], None]

INSTALL_HINT = "pip install 'bisect-precision-docker[ray]'"
NPU = "NPU"  # Ray's resource name for Huawei Ascend cards
TASK_RETRIES = 2  # Ray's own retries of a task whose node or worker died
STARVED_S = 60.0  # how long a task may wait while no live node could ever take it
_POLL_S = 2.0
_CANCEL_GRACE_S = 30.0  # how long an interrupted driver waits for its tasks to clean up
_LOG_BATCH = 64  # log lines a node sends the driver at once (--verbose) ...
_LOG_FLUSH_S = 0.5  # ... or what it has every this long
NODE_DIR_ENV = "BISECT_NODE_DIR"  # read on the nodes; not a driver setting
_PROBE = ".ray-driver-{token}"  # in the cache dir: a node that sees it shares the driver's disk


def import_ray() -> Any:
    """The `ray` module, or a one-line error that says how to get it."""
    # Ray's core worker installs absl's fatal-signal handler in the driver, SIGTERM included: a
    # CI runner's cancel dumped a stack and killed the process before the tool could remove its
    # containers and say "interrupted". The tool handles SIGTERM itself (as Ctrl-C).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise BadInput(
            f"--executor ray needs Ray: {INSTALL_HINT} (or use --executor local)"
        ) from None
    return ray


@dataclass(frozen=True)
class NodeSettings:
    """What every node needs to know besides the job itself."""

    platform: str
    device_mode: DeviceMode
    device_map: tuple[str, ...]
    cards_per_test: int
    cpus: float | None
    cache_root: str  # the driver's cache directory
    probe: str  # a file in it; a node that sees it shares the driver's storage
    shared: bool | None = None  # None: decide by the probe; False: always ship through Ray


@dataclass
class _BuildOnNode:
    package: str
    commit: str
    sources: list[Any]  # [ObjectRef of the tarball]: nested, so Ray fetches it only on demand
    settings: BuildSettings
    builder: Builder | None
    ccache_dir: str
    committed: int | None = None  # the commit's time, the build's SOURCE_DATE_EPOCH
    log: Any = None  # the driver's log queue (--verbose): the build's lines go there
    inputs: dict[str, str] = field(default_factory=dict)  # see `BuildJob.inputs`


@dataclass
class _Built:
    result: WheelResult
    entry: bytes | None  # the cache entry as a tarball when the node built into its own cache


@dataclass
class _RunOnNode:
    job: RunJob
    files: dict[str, list[Any]]  # driver path -> [ObjectRef of its bytes or tarball]
    log: Any = None  # the driver's log queue (--verbose): the layering's and the run's lines


@dataclass
class _Ran:
    report: RunReport
    artifacts: bytes
    facts: dict[str, str] = field(default_factory=dict)


# -- on the nodes ------------------------------------------------------------------------------


def node_name() -> str:
    """The host and Ray node that runs this task, as the report shows it."""
    import ray

    return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"


class _Lines:
    """A task's log lines for the driver (--verbose), sent through its queue (a Ray actor) in
    batches: when `_LOG_BATCH` lines are waiting, else every `_LOG_FLUSH_S` (a line the example
    prints before minutes of silence must not wait for the next one), the rest when the task
    ends. A log line is never worth failing a task for: a send that fails is dropped."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.prefix = f"[{node_name()}] "
        self.pending: list[str] = []
        self.lock = threading.Lock()  # Docker's log streams may call from several threads
        self.done = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name="log-lines", daemon=True)
        self.ticker.start()

    def __call__(self, line: str) -> None:
        with self.lock:
            self.pending.append(self.prefix + line.rstrip("\n"))
            if len(self.pending) >= _LOG_BATCH:
                self._send()

    def close(self) -> None:
        self.done.set()
        self.ticker.join()
        with self.lock:
            self._send()

    def _tick(self) -> None:
        while not self.done.wait(_LOG_FLUSH_S):
            with self.lock:
                self._send()

    def _send(self) -> None:
        if self.pending:
            with contextlib.suppress(Exception):
                self.queue.put_nowait_batch(self.pending)
        self.pending = []


@contextlib.contextmanager
def _streamed(queue: Any) -> Iterator[Callable[[str], None] | None]:
    """The echo a node task streams its logs with, None when the driver is not listening."""
    if queue is None:
        yield None
        return
    lines = _Lines(queue)
    try:
        yield lines
    finally:
        lines.close()


@contextlib.contextmanager
def _none_left(client: docker.DockerClient) -> Iterator[None]:
    """Remove what this worker still owns when its task ends: Ray's cancel interrupts the task
    wherever it is, and a worker process runs one task at a time."""
    try:
        yield
    finally:
        with contextlib.suppress(InfrastructureError):
            remove_own_containers(client)


def _node_root() -> Path:
    """Where a node keeps what it fetched, built or ran when it shares no disk with the driver
    (NODE_DIR_ENV as the node was started, else the user's cache directory)."""
    root = Path(os.environ.get(NODE_DIR_ENV) or user_cache_dir("bisect-precision-docker"))
    root = root / "ray-node"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _shared(settings: NodeSettings) -> bool:
    if settings.shared is not None:
        return settings.shared
    return Path(settings.probe).exists()


def _fetch(ref: list[Any]) -> bytes:
    import ray

    return ray.get(ref[0])


def _local_copy(driver_path: str, ref: list[Any], shared: bool, kind: str) -> Path:
    """The driver's file or directory at a path this node can read.

    Content-addressed paths only (cache entries, the lib snapshot): equal path, equal content.
    """
    path = Path(driver_path)
    if shared and path.exists():
        return path
    digest = hashlib.sha256(driver_path.encode()).hexdigest()[:16]
    local = _node_root() / kind / digest / path.name
    with FileLock(str(local.parent) + ".lock"):
        if not local.exists():
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_node_root()))
            try:
                data = _fetch(ref)
                if kind == "lib":
                    untar(data, staging / path.name)
                else:
                    (staging / path.name).write_bytes(data)
                local.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / path.name, local)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return local


def _require_image(client: Any, image_id: str, what: str) -> None:
    if not image_present(client, image_id):
        raise InfrastructureError(
            f"Ray node {node_name()} lacks the {what} {image_id[:19]}: every node needs the same "
            "base image, by id (docker pull it by digest, or docker save / docker load it)"
        )


def _node_engine() -> docker.DockerClient:
    """This node's Docker Engine; a node without one is named, not mistaken for the driver."""
    try:
        return connect()
    except InfrastructureError as exc:
        raise InfrastructureError(f"Ray node {node_name()}: {exc}") from None


def build_on_node(task: _BuildOnNode, settings: NodeSettings) -> _Built:
    """One wheel, built in this node's Docker Engine (a Ray task)."""
    client = _node_engine()
    shared = _shared(settings)
    _require_image(client, task.settings.base_image_id, "base image")
    builder = task.builder
    if builder is not None:
        here = find_builder(client, builder.key)
        if here is None:
            raise InfrastructureError(
                f"Ray node {node_name()} lacks the builder image {builder.key[:12]}: run "
                "`bisect-precision-docker builder prepare` there with the session's settings, "
                "or docker save / docker load the image `builder ls` shows on the driver"
            )
        builder = replace(builder, image_id=here)
    if shared:
        cache = WheelCache(Path(settings.cache_root) / "wheels")
        ccache = Path(task.ccache_dir)
    else:
        cache = WheelCache(_node_root() / "wheels")
        ccache = _node_root() / "ccache" / task.package
    ccache.mkdir(parents=True, exist_ok=True)
    with _none_left(client), _streamed(task.log) as echo:
        result = build_wheel(
            client,
            cache,
            task.package,
            task.commit,
            lambda dest: _unpack(task, dest),
            task.settings,
            ccache_dir=ccache,
            builder=builder,
            parallel=max(2, (os.cpu_count() or 2) // max(1, int(_node_cpus()))),
            echo=echo,
            inputs=task.inputs,
        )
    entry = None if shared else tar_directory(cache.entry_dir(result.key))
    return _Built(result=result, entry=entry)


def _unpack(task: _BuildOnNode, dest: Path) -> ExportResult:
    """The driver's export of the task's sources, unpacked here."""
    untar(_fetch(task.sources), dest)
    return ExportResult(task.commit, dest, {}, 0.0, task.committed)


def _node_cpus() -> float:
    import ray

    node = ray.get_runtime_context().get_node_id()
    for info in ray.nodes():
        if info.get("NodeID") == node:
            return float(info.get("Resources", {}).get("CPU", 1))
    return 1.0


def run_on_ray_node(task: _RunOnNode, settings: NodeSettings) -> _Ran:
    """Layer the test image and run the example on the card(s) Ray gave this task."""
    import ray

    job = task.job
    client = _node_engine()
    remove_stale_containers(client)  # what a killed worker on this host left behind
    _require_image(client, job.base_image_id, "base image")
    name = node_name()
    shared = _shared(settings)
    cards = [str(c) for c in ray.get_runtime_context().get_accelerator_ids().get(NPU, [])]
    if is_simulator(settings.platform):
        # Each run is a simulator of its own container: lane 0, whatever --device said.
        device = "0"
        slot = Slot(device=device, cpus=settings.cpus, node=name)
    else:
        device = ",".join(cards)
        try:
            through = passthrough(
                settings.device_mode, settings.platform, cards, settings.device_map
            )
        except BadInput as exc:
            raise InfrastructureError(f"Ray node {name}, cards {device}: {exc}") from None
        slot = Slot(device=device, passthrough=through, node=name)

    def local(path: Path | None, kind: str) -> Path | None:
        if path is None:
            return None
        return _local_copy(str(path), task.files[str(path)], shared, kind)

    _sweep_dead_runs(_node_root())
    # The worker's pid names the folder: a worker killed mid-run cannot remove it, the next does.
    scratch = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=_node_root()))
    try:
        artifacts = scratch / job.run.artifacts_dir.name
        here = replace(
            job,
            pypto_wheel=local(job.pypto_wheel, "wheel"),
            simpler_wheel=local(job.simpler_wheel, "wheel"),
            pip_wheel=local(job.pip_wheel, "wheel"),
            run=replace(job.run, lib_dir=local(job.run.lib_dir, "lib"), artifacts_dir=artifacts),
        )
        with _none_left(client), _streamed(task.log) as echo:
            report = run_on_node(
                client, here, lambda: slot, lambda _slot: None, threading.Event(), echo=echo
            )
        facts = {**host_facts(), "base_image_id": job.base_image_id}
        return _Ran(report=report, artifacts=tar_directory(artifacts), facts=facts)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _sweep_dead_runs(root: Path) -> None:
    """Remove the run folders of workers that died (killed mid-run: no `finally` ran)."""
    for folder in root.glob("run-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not pid_answers(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


# -- tarballs ----------------------------------------------------------------------------------


def tar_directory(directory: Path) -> bytes:
    """The directory's contents as an uncompressed tarball (sources compress little and fast
    links matter more than bytes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for child in sorted(directory.iterdir()) if directory.is_dir() else []:
            archive.add(child, arcname=child.name)
    return buffer.getvalue()


def untar(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
        else:  # Python before 3.10.12: the tarball is our own export
            archive.extractall(dest)


# -- on the driver -----------------------------------------------------------------------------


class RayExecutor(Executor):
    """Builds and runs as Ray tasks; see the module docstring."""

    name = "ray"

    def __init__(
        self,
        ray: Any,
        cache: WheelCache,
        settings: NodeSettings,
        *,
        client: Any = None,
        echo: Echo | None = None,
        warn: Echo | None = None,
        owns_connection: bool = False,
        starved_s: float = STARVED_S,
    ) -> None:
        self.ray = ray
        self.cache = cache
        self.settings = settings
        self.client = client  # the driver's engine, for the last sweep of orphaned containers
        self.echo = echo
        self.warn = warn or echo
        self._owns = owns_connection
        self._starved_s = starved_s
        self._lock = threading.Lock()
        self._builds: dict[str, SharedBuild] = {}
        self._speculative: dict[str, bool] = {}
        self._tasks: dict[Any, str | None] = {}  # in-flight ObjectRef -> build key (None: run)
        self._refs: dict[str, list[Any]] = {}  # driver path -> [ObjectRef]
        self._retired: dict[tuple[str, str], str] = {}
        self._closed = False
        self._stopping = False  # closed with cancel: waiting threads give up
        self._cancelled: set[Any] = set()  # refs `close` cancelled
        self._threads = ThreadPoolExecutor(max_workers=32, thread_name_prefix="ray")
        retries = {"max_retries": TASK_RETRIES, "retry_exceptions": False}
        self._build_task = ray.remote(build_on_node).options(num_cpus=1, **retries)
        if is_simulator(settings.platform):
            run_resources: dict[str, Any] = {"num_cpus": settings.cpus or 1}
        else:
            run_resources = {"num_cpus": 0, "resources": {NPU: settings.cards_per_test}}
        self._run_task = ray.remote(run_on_ray_node).options(**run_resources, **retries)
        self._log: Any = None  # the queue the nodes stream logs into (--verbose)
        self._drainer: threading.Thread | None = None
        self._tasks_over = threading.Event()  # every driver thread is done: drain, then stop
        if echo is not None:
            from ray.util.queue import Queue

            self._log = Queue(actor_options={"num_cpus": 0})
            self._drainer = threading.Thread(target=self._drain, name="ray-logs", daemon=True)
            self._drainer.start()

    @classmethod
    def connect(
        cls,
        prepared: Prepared,
        cache: WheelCache,
        *,
        echo: Echo | None = None,
        warn: Echo | None = None,
    ):
        """Join the cluster at ``--ray-address`` and check it can run this session's tests."""
        ray = import_ray()
        settings = prepared.settings
        address = settings.ray_address or "auto"
        logging.getLogger("ray").setLevel(logging.WARNING)
        _check_reachable(ray, address)
        # ray.init makes SIGTERM a bare sys.exit(15): the tool's own handler (an interrupt that
        # removes the containers and says so) is put back afterwards.
        on_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            # The nodes run their own installation of this package (the same version): shipping
            # `runner` as a py_module would leave its Dockerfile templates behind.
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            # Ray's messages run over several lines ("To fix this, either:" and a list).
            first = truncate(str(exc), 240) or type(exc).__name__
            raise InfrastructureError(
                f"cannot join the Ray cluster at {address!r} ({first}); start one with "
                f"`ray start --head` or pass --ray-address HOST:PORT{_auth_hint()}"
            ) from None
        finally:
            if threading.current_thread() is threading.main_thread() and on_sigterm is not None:
                signal.signal(signal.SIGTERM, on_sigterm)
        _cluster_messages_to_stderr(ray)
        token = uuid.uuid4().hex
        probe = prepared.cache_root / _PROBE.format(token=token)
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("the nodes that see this file share the driver's cache directory\n")
        executor = cls(
            ray,
            cache,
            NodeSettings(
                platform=settings.platform,
                device_mode=settings.device_mode,
                device_map=tuple(settings.device_map),
                cards_per_test=settings.cards_per_test,
                cpus=settings.cpus,
                cache_root=str(prepared.cache_root),
                probe=str(probe),
            ),
            client=prepared.client,
            echo=echo,
            warn=warn,
            owns_connection=True,
        )
        if not executor.slots:
            executor.close(cancel=True)
            if is_simulator(settings.platform):
                cpus = settings.cpus or 1
                raise BadInput(
                    f"the Ray cluster at {address!r} has no node with {cpus:g} CPUs for a "
                    f"simulator run (--cpus {cpus:g}); start nodes with more "
                    "(`ray start --address ... --num-cpus N`) or lower --cpus"
                )
            raise BadInput(
                f"the Ray cluster at {address!r} has no node with {settings.cards_per_test} "
                f"{NPU} to run an example; start the NPU nodes with `ray start --address ... "
                f"--resources '{{\"{NPU}\": N}}'` (N cards each)"
            )
        return executor

    # -- the interface ---------------------------------------------------------------------

    @property
    def slots(self) -> Sequence[Slot]:
        """One slot per `cards_per_test` cards (or CPUs on simulators) the live nodes offer."""
        resources = self.ray.cluster_resources()
        if is_simulator(self.settings.platform):
            count = int(resources.get("CPU", 0) // (self.settings.cpus or 1))
        else:
            count = int(resources.get(NPU, 0) // self.settings.cards_per_test)
        count = max(0, count - len(self._retired))
        return [Slot(device=f"ray-{i}", node="ray") for i in range(count)]

    @property
    def build_jobs(self) -> int:
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def busy_builds(self) -> int:
        with self._lock:
            return sum(1 for b in self._builds.values() if not b.build.done())

    def build(self, job: BuildJob) -> Future[WheelResult]:
        key = self.cache.key(*job.key_args)
        with self._lock:
            if self._closed:
                return _failed(Cancelled("the session is stopping"))
            shared = self._builds.get(key)
            if shared is None or shared.build.done():
                shared = SharedBuild(self._threads.submit(self._build, job, key))
                self._builds[key] = shared
                self._speculative[key] = job.speculative
            elif not job.speculative:
                self._speculative[key] = False
            return shared.attach(speculative=job.speculative)

    def run(self, job: RunJob) -> Future[RunReport]:
        with self._lock:
            if self._closed:
                return _failed(Cancelled("the session is stopping"))
            if job.speculative:
                # Images are layered where the run lands, which is not known yet.
                return _done(RunReport(result=None, image_id="", image_s=0.0, slot=None))
            return self._threads.submit(self._run, job)

    def retire(self, slot: Slot, reason: str) -> None:
        """Ray places tasks by resources, not by card: a faulty card makes the pool smaller by
        one slot, and the message names the node and card to look at."""
        with self._lock:
            if len(self.slots) <= 1 or (slot.node, slot.device) in self._retired:
                return
            self._retired[(slot.node, slot.device)] = reason
        if self.warn:
            self.warn(
                f"device {slot.device} on {slot.node} taken out of the pool (Ray places runs by "
                f"resources, not by card: one slot fewer from now on): {reason}"
            )

    def close(self, *, cancel: bool) -> None:
        with self._lock:
            self._closed = True
            self._stopping = cancel
            doomed = [
                ref
                for ref, key in self._tasks.items()
                if cancel or (key is not None and self._speculative.get(key, False))
            ]
            self._cancelled.update(doomed)
        for ref in doomed:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref)
        if cancel and doomed:
            # A cancelled task removes its container as it unwinds; a driver that disconnects
            # first takes its workers down with it, and their containers stay behind.
            with contextlib.suppress(Exception):
                self.ray.wait(doomed, num_returns=len(doomed), timeout=_CANCEL_GRACE_S)
        # Every driver thread must be out of Ray's calls before it shuts down (a thread still in
        # ray.wait then crashed the process); with cancel they give up within one poll.
        self._threads.shutdown(wait=True, cancel_futures=True)
        self._tasks_over.set()
        if self._drainer is not None:
            self._drainer.join()  # it drains what the last tasks sent, then stops
            with contextlib.suppress(Exception):
                self._log.shutdown()
        with contextlib.suppress(OSError):
            Path(self.settings.probe).unlink()
        if self.client is not None:
            with contextlib.suppress(Exception):
                remove_stale_containers(self.client)
        if self._owns:
            with contextlib.suppress(Exception):
                self.ray.shutdown()

    # -- driver threads --------------------------------------------------------------------

    def _drain(self) -> None:
        """Echo the lines the nodes stream (--verbose) until the executor closes."""
        while True:
            closing = self._tasks_over.is_set()
            with contextlib.suppress(Exception):
                waiting = self._log.qsize()
                for line in self._log.get_nowait_batch(waiting) if waiting else ():
                    self.echo(line)
            if closing:
                return
            time.sleep(0.2)

    def _build(self, job: BuildJob, key: str) -> WheelResult:
        hit = self.cache.lookup(*job.key_args)
        if hit is not None:
            return hit
        with tempfile.TemporaryDirectory(prefix="ray-export-") as tmp:
            exported = job.prepare(Path(tmp))
            sources = self.ray.put(tar_directory(Path(tmp)))
        task = _BuildOnNode(
            package=job.package,
            commit=job.commit,
            sources=[sources],
            settings=job.settings,
            builder=job.builder,
            ccache_dir=str(job.ccache_dir),
            committed=exported.committed if isinstance(exported, ExportResult) else None,
            log=None if job.speculative else self._log,
            inputs=dict(job.inputs),
        )
        built: _Built = self._wait(
            self._build_task.remote(task, self.settings),
            f"the {job.package} build of {job.commit[:12]}",
            key=key,
        )
        if built.entry is None:  # built into the shared cache
            self.cache.use(built.result.key)
            return built.result
        return self._adopt(built)

    def _adopt(self, built: _Built) -> WheelResult:
        """Put a node's cache entry into the driver's cache (atomically, once)."""
        result = built.result
        final = self.cache.entry_dir(result.key)
        with self.cache.locked(result.key):
            if not (final / "entry.json").exists():
                self.cache.tmp_dir.mkdir(parents=True, exist_ok=True)
                staged = Path(tempfile.mkdtemp(prefix="ray-", dir=self.cache.tmp_dir))
                try:
                    untar(built.entry or b"", staged / "entry")
                    final.parent.mkdir(parents=True, exist_ok=True)
                    shutil.rmtree(final, ignore_errors=True)
                    os.replace(staged / "entry", final)
                finally:
                    shutil.rmtree(staged, ignore_errors=True)
        self.cache.use(result.key)
        wheel = final / result.wheel.name if result.wheel is not None else None
        return replace(result, wheel=wheel, log_path=final / "build.log")

    def _run(self, job: RunJob) -> RunReport:
        files: dict[str, list[Any]] = {}
        for path in (job.pypto_wheel, job.simpler_wheel, job.pip_wheel):
            if path is not None:
                files[str(path)] = self._shipped(path, directory=False)
        files[str(job.run.lib_dir)] = self._shipped(job.run.lib_dir, directory=True)
        ran: _Ran = self._wait(
            self._run_task.remote(_RunOnNode(job=job, files=files, log=self._log), self.settings),
            f"the example run of {job.pypto[:12]}",
            key=None,
        )
        artifacts = job.run.artifacts_dir
        untar(ran.artifacts, artifacts)
        report = ran.report
        result = report.result
        if result is not None:
            result = replace(result, log_path=artifacts / result.log_path.name)
        return replace(report, result=result, facts=dict(ran.facts))

    def _until_done(self, ref: Any, what: str, *, run: bool) -> None:
        """Wait for the task, but not for ever when no live node can take it any more (every
        NPU node gone): Ray would keep it pending until one joins."""
        starved: float | None = None
        while not self.ray.wait([ref], timeout=min(_POLL_S, self._starved_s))[0]:
            if self._stopping:
                # Submitted while the session stopped, or not cancelled yet: cancel it, and let it
                # remove its container before the driver leaves. Never twice: a second cancel
                # interrupts the task again while it removes its container, which then stays.
                with self._lock:
                    again = ref in self._cancelled
                    self._cancelled.add(ref)
                if not again:
                    with contextlib.suppress(Exception):
                        self.ray.cancel(ref)
                with contextlib.suppress(Exception):
                    self.ray.wait([ref], timeout=_CANCEL_GRACE_S)
                raise Cancelled(f"{what} was stopped: the session is stopping")
            if self._feasible(run):
                starved = None
                continue
            starved = starved or time.monotonic()
            if time.monotonic() - starved >= self._starved_s:
                with contextlib.suppress(Exception):
                    self.ray.cancel(ref, force=True)
                need = "CPU" if not run or is_simulator(self.settings.platform) else NPU
                raise InfrastructureError(
                    f"{what} waited {self._starved_s:g}s for a Ray node with {need}, and none "
                    "is left in the cluster; start one (`ray start --address ...`) and run again"
                )

    def _feasible(self, run: bool) -> bool:
        resources = self.ray.cluster_resources()
        if run and not is_simulator(self.settings.platform):
            return resources.get(NPU, 0) >= self.settings.cards_per_test
        needed = (self.settings.cpus or 1) if run else 1
        return resources.get("CPU", 0) >= needed

    def _shipped(self, path: Path, *, directory: bool) -> list[Any]:
        """An object-store copy of a driver file, made once; nodes fetch it only if they must."""
        key = str(path)
        with self._lock:
            ref = self._refs.get(key)
        if ref is None:
            data = tar_directory(path) if directory else path.read_bytes()
            ref = [self.ray.put(data)]
            with self._lock:
                ref = self._refs.setdefault(key, ref)
        return ref

    def _wait(self, ref: Any, what: str, *, key: str | None) -> Any:
        ray = self.ray
        with self._lock:
            self._tasks[ref] = key
        try:
            self._until_done(ref, what, run=key is None)
            return ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            raise Cancelled(f"{what} was stopped: the session no longer needs it") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BisectError | OSError):
                raise cause from None
            raise InfrastructureError(
                f"{what} failed on its Ray node: {_first_line(exc)}; not a verdict"
            ) from None
        except ray.exceptions.RayError as exc:
            raise InfrastructureError(
                f"{what} lost its Ray node or worker ({type(exc).__name__}) after "
                f"{TASK_RETRIES} retries; not a verdict"
            ) from None
        finally:
            with self._lock:
                self._tasks.pop(ref, None)


def _check_reachable(ray: Any, address: str) -> None:
    """Fail in seconds when nothing listens at the cluster's address: `ray.init` would retry
    for minutes before it gives up."""
    if address != "auto":
        scheme, _, rest = address.rpartition("://")
        host, _, port = rest.rpartition(":")
        if scheme == "ray":
            # Ray Client: the driver would sit outside the cluster, away from the nodes' Docker
            # Engines and the cache they share; it also needs `ray[client]`.
            raise BadInput(
                f"--ray-address {address}: Ray Client addresses are not supported; run the tool "
                "on a node of the cluster (`ray start --address ...`) and give the head's "
                "HOST:PORT"
            )
        if scheme or not host or not port.isdigit():
            raise BadInput(
                f"--ray-address {address}: give the head's HOST:PORT (its GCS port, 6379 unless "
                "`ray start --head --port` said otherwise), or auto"
            )
    resolve = getattr(getattr(ray, "_private", None), "services", None)
    try:
        if address == "auto" and resolve is not None:
            address = resolve.canonicalize_bootstrap_address(address) or ""
    except Exception:
        return  # Ray's own message is clearer than a guess here
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise InfrastructureError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
            "`ray start --head` or pass the head's --ray-address HOST:PORT"
        ) from None


def _auth_hint() -> str:
    """`ray start --head` turns token authentication on by itself when a token file exists, and
    a driver without RAY_AUTH_MODE=token is then refused with nothing but a log line."""
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_MODE") or not token.is_file():
        return ""
    return (
        f"; a Ray token exists ({token}): if the cluster uses token authentication, set "
        "RAY_AUTH_MODE=token"
    )


def _cluster_messages_to_stderr(ray: Any) -> None:
    """Ray prints cluster events ("Raylet is terminated") on the driver's stdout, where `--json`
    keeps the report alone: send them to stderr with the rest of the tool's messages."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "to_stderr", False):
        return
    if os.environ.get("NO_COLOR") or not sys.stderr.isatty():
        # Ray colours its "(raylet)" prefixes unless told not to, even in a CI log or a file.
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = data.get("lines") or []
        if data.get("pid") == "raylet":
            lines = cluster_events(lines)
            if not lines:
                return
        original({**data, "lines": lines, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


_RAY_LOG_LINE = re.compile(r"^\s*\[\d{4}-\d\d-\d\d [\d:,.]+ [A-Z] \d+ \d+\]|^\s*\[state-dump\]")


def cluster_events(lines: Sequence[str]) -> list[str]:
    """What a user needs of a raylet's message: its first line, shortened. A node that died
    sends its last log lines too (dozens of C++ log and state-dump lines), and every message
    continues with indented detail; the tool says itself what it does about a lost node (the
    task is retried elsewhere; it is never a verdict)."""
    kept = []
    for line in lines:
        if not line.strip() or line[:1].isspace() or _RAY_LOG_LINE.match(line):
            continue
        kept.append(line if len(line) <= 160 else line[:157].rstrip() + "...")
    return kept


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _failed(exc: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future
