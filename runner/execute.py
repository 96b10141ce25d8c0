"""Every container the tool runs goes through here: create, stream logs, time out, always remove.

A bisect runs dozens of containers for hours, often on a shared NPU host, so a container left
behind is a real cost (it may hold an NPU). Hence every container carries labels saying the tool
made it and which process owns it, and is removed in a ``finally`` whatever happens; a SIGKILLed
tool is cleaned up by the next run through `remove_stale_containers`.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from runner.containers import ContainerResult, ContainerSpec, Mount
from runner.devices import Passthrough
from runner.errors import STOP_SIGNALS, BadInput, InfrastructureError

if TYPE_CHECKING:
    from docker.models.containers import Container

LABEL = "bisect-precision-docker"
OWNER_LABEL = "bisect-precision-docker.owner"  # host:pid, for people and `docker ps --filter`
RUN_LABEL = "bisect-precision-docker.run"  # a random token per process: what "mine" means
PROCESS_LABEL = "bisect-precision-docker.process"  # pid namespace, boot and start time
KIND_LABEL = "bisect-precision-docker.kind"

LIB_MOUNT = "/bisect/lib"
RUN_MOUNT = "/bisect/run"
BUILD_OUTPUT = f"{RUN_MOUNT}/build_output"

_POLL_SECONDS = 0.2  # how quickly a Ctrl-C or a failing echo stops the wait
_GRACE_SECONDS = 10.0  # how long to wait for the engine to confirm a kill or flush the logs
_LINE_LIMIT = 1 << 20  # characters of one unfinished line held before they are passed on
ENGINE_ERRORS = (docker.errors.APIError, docker.errors.DockerException, requests.RequestException)


class Cancelled(Exception):
    """A container was stopped because its result is no longer wanted (never a verdict)."""


def connect() -> docker.DockerClient:
    """A client for the engine named by the environment, checked to answer right now."""
    try:
        client = docker.from_env()
        client.ping()
    except ENGINE_ERRORS as exc:
        raise InfrastructureError(
            f"no Docker Engine answers ({_one_line(exc)}); start dockerd or set DOCKER_HOST"
        ) from exc
    return client


_RUN_TOKENS: dict[int, str] = {}


def _run_token() -> str:
    """This process's token; a forked child is another owner and gets its own."""
    return _RUN_TOKENS.setdefault(os.getpid(), uuid.uuid4().hex)


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def _start_ticks(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot): a reused pid has another start time."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _process_identity(pid: int) -> str:
    boot = _read("/proc/sys/kernel/random/boot_id") or "unknown"
    return f"{_pid_namespace()};{boot};{_start_ticks(pid) or 'unknown'}"


def process_owner() -> dict[str, str]:
    """The owner labels of this process's containers.

    Host and pid alone name a process only inside one PID namespace: two containerised CI
    runners on one host (host networking, same hostname) would take each other's live
    containers for stale ones. So the labels also carry a per-process token (what
    `remove_own_containers` removes) and the PID namespace, boot and start time that
    `owner_is_alive` needs before it may call an owner gone.
    """
    return {
        OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}",
        RUN_LABEL: _run_token(),
        PROCESS_LABEL: _process_identity(os.getpid()),
    }


def owner_is_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the process that owns a container with these labels still runs.

    None when this process cannot know: another host, another PID namespace, another boot, or
    labels it cannot read. Only False (gone for sure) makes a container stale.
    """
    host, _, pid_text = labels.get(OWNER_LABEL, "").rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) <= 0:
        return None
    pid = int(pid_text)
    identity = labels.get(PROCESS_LABEL)
    if identity is None:
        return pid_answers(pid)  # labelled by an earlier version: host and pid only
    namespace, boot, started = [*identity.split(";"), "", "", ""][:3]
    here = _pid_namespace()
    if "unknown" in (namespace, here) or namespace != here:
        return None
    if boot != (_read("/proc/sys/kernel/random/boot_id") or "unknown"):
        return None if boot == "unknown" else False  # the machine restarted since
    if not pid_answers(pid):
        return False
    try:
        proc_is_ours = os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        proc_is_ours = False
    now = _start_ticks(pid) if proc_is_ours else None
    if now is None or started in ("", "unknown"):
        return True  # /proc shows another namespace's pids: trust the signal check
    return now == started  # False: the pid now belongs to another process, the owner is gone


def pid_answers(pid: int) -> bool:
    """Whether a process with this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_container(
    client: docker.DockerClient,
    spec: ContainerSpec,
    *,
    log_path: Path,
    timeout: float | None = None,
    echo: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    before_removal: Callable[[Container, ContainerResult], None] | None = None,
) -> ContainerResult:
    """Run one container to its end (or `timeout` seconds) and remove it, whatever happens.

    Setting `cancel` (from another thread) kills the container and raises `Cancelled`.
    `before_removal` gets the exited container and its result (image layering commits it);
    engine errors it raises are infrastructure failures like the run's own.

    Logs go line by line to `log_path` (and `echo`) while the container runs, so a long run can
    be followed with ``tail -f`` and a killed one still leaves its output behind. An exception
    raised by `echo` (a Ctrl-C included) stops the run and propagates after the cleanup.
    """
    name = f"bisect-precision-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    container: Container | None = None
    failing = False
    try:
        try:
            with _uninterrupted():
                container = client.containers.create(**_create_arguments(spec, name))
        except docker.errors.ImageNotFound as exc:
            # The base image is checked before a run starts; an image the tool made that is gone
            # now was removed meanwhile (a prune, another run's cleanup): retry, it is rebuilt.
            raise InfrastructureError(
                f"image {spec.image[:19]} disappeared from the Docker Engine while in use "
                "(pruned meanwhile?); run again and it is made anew"
            ) from exc
        result = _supervise(container, log_path, timeout, echo, cancel)
        if before_removal is not None:
            before_removal(container, result)
        return result
    except ENGINE_ERRORS as exc:
        failing = True
        raise InfrastructureError(
            f"the Docker Engine failed running a container of {spec.image} ({_one_line(exc)}); "
            "check `docker info` and the engine log"
        ) from exc
    except BaseException:
        failing = True
        raise
    finally:
        with _uninterrupted():
            _remove(client, container, name, quiet=failing)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while the engine creates or removes a container.

    An interrupt between sending a create and reading its answer left a container the engine
    made after the cleanup had looked for it; one just before a remove was sent left the
    container too. Ray's cancel of a task is such an interrupt: it runs the SIGINT handler in
    the worker's main thread. Only the main thread gets them, and only there can handlers be
    swapped; a signal that came meanwhile is raised again, to the tool's handler, afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}
    try:
        for number in STOP_SIGNALS:
            if callable(signal.getsignal(number)):  # SIG_DFL/SIG_IGN: the process ends anyway
                previous[number] = signal.signal(number, lambda got, _frame: held.append(got))
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(held):
            signal.raise_signal(number)


def tool_containers(client: docker.DockerClient, *, run: str | None = None) -> list[Container]:
    """Containers of this tool in any state, optionally of one run (a `RUN_LABEL` token).

    Other runs remove containers concurrently, so one vanishing mid-listing is not an error.
    """
    labels = [f"{LABEL}=1"] if run is None else [f"{LABEL}=1", f"{RUN_LABEL}={run}"]
    return client.containers.list(all=True, filters={"label": labels}, ignore_removed=True)


def remove_stale_containers(client: docker.DockerClient) -> list[str]:
    """Remove tool containers whose owner process on this host is gone; return their names.

    After a SIGKILL of the tool nothing else can clean up, so every session calls this first.
    Containers of live processes, or of other hosts sharing the engine, are left alone.
    """
    removed: list[str] = []
    try:
        for container in tool_containers(client):
            if owner_is_alive(container.labels) is not False:
                continue
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # another run is removing it right now
                    continue
                raise
            removed.append(container.name)
    except ENGINE_ERRORS as exc:
        # Only the dead runs' containers: other runs may share this engine.
        raise InfrastructureError(
            f"could not remove stale containers ({_one_line(exc)}); "
            "`bisect-precision-docker cleanup` removes those whose run has ended"
        ) from exc
    return removed


def remove_own_containers(client: docker.DockerClient) -> None:
    """Remove every container this process still owns (for signal handlers and atexit)."""
    token = _run_token()
    try:
        for container in tool_containers(client, run=token):
            try:
                with _uninterrupted():
                    container.remove(force=True)
            except docker.errors.NotFound:
                continue
    except ENGINE_ERRORS as exc:
        raise InfrastructureError(
            f"could not remove the containers of this run ({_one_line(exc)}); remove them with "
            f"`docker rm -f $(docker ps -aq --filter label={RUN_LABEL}={token})`"
        ) from exc


@dataclass
class ExampleRun:
    """One run of a pypto-lib example in an image that has pypto and simpler installed."""

    image: str
    lib_dir: Path  # pypto-lib checkout, mounted read-only at /bisect/lib
    script: str  # relative to lib_dir
    platform: str
    device: str
    # <workdir>/runs/<run-id>/, mounted rw at /bisect/run; generated code goes to build_output/
    artifacts_dir: Path
    passthrough: Passthrough
    extra_args: list[str] = field(default_factory=list)
    python: str = "python3"
    environment: dict[str, str] = field(default_factory=dict)  # PTO2_RING_*, ASCEND_HOME_PATH...
    ptoas_root: Path | None = None  # mounted read-only at the same path, PTOAS_ROOT set
    pto_isa_root: Path | None = None  # mounted read-only at the same path, PTO_ISA_ROOT set
    cpus: float | None = None
    memory: str | None = None  # Docker's --memory: "8g"
    timeout: float | None = None
    # uid:gid that gets the artifacts; None = this process, so a non-root user can delete them
    owner: tuple[int, int] | None = None


# Runs the example, then hands what it wrote to the invoking user, keeping the example's exit code.
_CHOWN_WRAPPER = '"$@"; status=$?; chown -R {owner} ' + RUN_MOUNT + " 2>/dev/null; exit $status"


@dataclass(frozen=True)
class ImageDefaults:
    """What of the test image's own config the example's container keeps."""

    user: str = ""  # its USER: CANN images may run as HwHiAiUser
    python_path: str = ""  # its ENV PYTHONPATH (CANN's Python paths, where set there)

    @property
    def non_root(self) -> bool:
        return self.user.split(":", 1)[0] not in ("", "root", "0")


def image_defaults(client: docker.DockerClient, image: str) -> ImageDefaults:
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except docker.errors.DockerException as exc:
        shown = image[:19] if image.startswith("sha256:") else image
        raise InfrastructureError(f"cannot inspect image {shown}: {exc}") from exc
    variables = dict(v.split("=", 1) for v in config.get("Env") or [] if "=" in v)
    return ImageDefaults(config.get("User") or "", variables.get("PYTHONPATH", ""))


def example_container(run: ExampleRun, image: ImageDefaults | None = None) -> ContainerSpec:
    """The container of one example run; pure, so the whole layout is unit-testable.

    `image`: the test image's USER and PYTHONPATH. The pypto-lib checkout goes first on the
    image's PYTHONPATH rather than in its place. An example run as a user other than root
    writes into the run directory (made writable for it) with a umask that lets the invoking
    user delete what it wrote, since it cannot hand the files over itself."""
    image = image or ImageDefaults()
    script = PurePosixPath(run.script)
    if script.is_absolute() or ".." in script.parts or not script.parts:
        raise BadInput(
            f"example {run.script!r} must be a path inside the pypto-lib checkout, "
            f"e.g. models/qwen3_14b/decode_fwd.py"
        )
    pass_ = run.passthrough
    environment = {**run.environment, **pass_.environment}
    paths = (LIB_MOUNT, environment.get("PYTHONPATH"), image.python_path)
    environment["PYTHONPATH"] = ":".join(dict.fromkeys(p for p in paths if p))
    environment["PYPTO_PROG_BUILD_DIR"] = BUILD_OUTPUT
    environment.setdefault("PYTHONUNBUFFERED", "1")
    mounts = [
        Mount(host=str(run.lib_dir.resolve()), container=LIB_MOUNT),
        Mount(host=str(run.artifacts_dir.resolve()), container=RUN_MOUNT, read_only=False),
    ]
    for variable, root in (("PTOAS_ROOT", run.ptoas_root), ("PTO_ISA_ROOT", run.pto_isa_root)):
        if root is not None:
            path = str(root.resolve())
            mounts.append(Mount(host=path, container=path))
            environment[variable] = path
    mounts.extend(pass_.mounts)
    wrapper = _CHOWN_WRAPPER.format(owner=_artifact_owner(run))
    if image.non_root:
        wrapper = f"umask 0000; {wrapper}"
    command = [
        *keep_explicit(environment),
        *("sh", "-c", wrapper, "bisect-example"),
        run.python,
        f"{LIB_MOUNT}/{script}",
        "-p",
        run.platform,
        "-d",
        run.device,
        *run.extra_args,
    ]
    return ContainerSpec(
        image=run.image,
        command=command,
        environment=environment,
        mounts=mounts,
        devices=list(pass_.devices),
        privileged=pass_.privileged,
        ipc_mode=pass_.ipc_mode,
        runtime=pass_.runtime,
        network=False,
        sandbox=True,
        working_dir=RUN_MOUNT,
        cpus=run.cpus,
        mem_limit=run.memory,
        labels={KIND_LABEL: "example"},
    )


# Variables the image's entrypoint sets (CANN's set_env.sh) that a user may set on purpose.
ENTRYPOINT_SET = ("ASCEND_HOME_PATH",)


def keep_explicit(environment: Mapping[str, str]) -> list[str]:
    """A command prefix that sets these variables again after the entrypoint has run.

    The container's environment is applied before the entrypoint, which would overwrite an
    explicit --ascend-home-path; `env NAME=value` after it has the last word.
    """
    chosen = [f"{name}={environment[name]}" for name in ENTRYPOINT_SET if name in environment]
    return ["env", *chosen] if chosen else []


def run_example(
    client: docker.DockerClient,
    run: ExampleRun,
    *,
    echo: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> ContainerResult:
    """Run the example; its output is in ``artifacts_dir/log.txt``, its code in build_output/."""
    script = run.lib_dir / run.script
    if not script.is_file():
        raise BadInput(f"example {run.script} not found in {run.lib_dir}; check the example path")
    run.artifacts_dir.mkdir(parents=True, exist_ok=True)
    defaults = image_defaults(client, run.image)
    if defaults.non_root:  # the image's user writes build_output/ there
        run.artifacts_dir.chmod(0o777)
    spec = example_container(run, defaults)
    result = run_container(
        client,
        spec,
        log_path=run.artifacts_dir / "log.txt",
        timeout=run.timeout,
        echo=echo,
        cancel=cancel,
    )
    if result.timed_out:
        # The kill skipped the wrapper's chown: hand the files over in a short second container.
        hand_back(
            client, spec, (RUN_MOUNT,), _artifact_owner(run), run.artifacts_dir / "chown-log.txt"
        )
    return result


def hand_back(
    client: docker.DockerClient,
    killed: ContainerSpec,
    paths: Sequence[str],
    owner: str,
    log_path: Path,
    timeout: float = _GRACE_SECONDS * 6,
) -> None:
    """Give `owner` ("uid:gid") the files a killed container left in its mounts at `paths`.

    A killed container never reaches its own chown, and a non-root caller cannot delete the
    root-owned files it wrote; the image it ran has `chown`, so a short second one does it.
    """
    chown = ContainerSpec(
        image=killed.image,
        command=["chown", "-R", owner, *paths],
        mounts=[m for m in killed.mounts if m.container in paths],
        labels={KIND_LABEL: "chown"},
    )
    run_container(client, chown, log_path=log_path, timeout=timeout)


def reclaim(client: docker.DockerClient, image: str, directory: Path, log_path: Path) -> bool:
    """Give the calling user back what root containers left under `directory`; True if needed.

    An example container killed with its run (SIGKILL, or removed as stale by the next run)
    never reaches its chown, and a user in the docker group cannot delete root-owned files:
    without this, such a user could not resume, prune or remove their own workdir.
    """
    if not hasattr(os, "getuid") or os.getuid() == 0 or not directory.is_dir():
        return False
    uid = os.getuid()
    foreign = False
    with contextlib.suppress(OSError):
        foreign = any(path.lstat().st_uid != uid for path in directory.rglob("*"))
    if not foreign:
        return False
    chown = ContainerSpec(
        image=image,
        command=["chown", "-R", f"{uid}:{os.getgid()}", "/reclaim"],
        mounts=[Mount(host=str(directory.resolve()), container="/reclaim", read_only=False)],
        labels={KIND_LABEL: "chown"},
        user="0:0",
    )
    run_container(client, chown, log_path=log_path, timeout=_GRACE_SECONDS * 6)
    return True


def _artifact_owner(run: ExampleRun) -> str:
    uid, gid = run.owner if run.owner is not None else (os.getuid(), os.getgid())
    return f"{uid}:{gid}"


def _create_arguments(spec: ContainerSpec, name: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "name": name,
        "detach": True,
        "environment": dict(spec.environment),
        "labels": {**spec.labels, LABEL: "1", **process_owner()},
        "mounts": [
            docker.types.Mount(
                target=mount.container, source=mount.host, type="bind", read_only=mount.read_only
            )
            for mount in spec.mounts
        ],
        "privileged": spec.privileged,
    }
    if not spec.network:
        arguments["network_mode"] = "none"
        arguments["network_disabled"] = not spec.sandbox
    optional = {
        "devices": list(spec.devices),
        "ipc_mode": spec.ipc_mode,
        "runtime": spec.runtime,
        "working_dir": spec.working_dir,
        "nano_cpus": int(spec.cpus * 1e9) if spec.cpus else None,
        "cpu_shares": spec.cpu_shares,
        "mem_limit": spec.mem_limit,
        "user": spec.user,
    }
    arguments.update({key: value for key, value in optional.items() if value})
    if spec.entrypoint is not None:
        arguments["entrypoint"] = list(spec.entrypoint)
    return arguments


class _LogPump(threading.Thread):
    """Copies the container's combined output to the log file and `echo`, line by line.

    Linear in the output however it is cut: a 50 MB progress bar without a newline used to be
    split again on every chunk. Once `abandon`ed (the stream stalled after the container
    exited), it writes nothing more: `read_back` owns the log from then on."""

    def __init__(
        self,
        container: Container,
        log_path: Path,
        echo: Callable[[str], None] | None,
        wake: threading.Event,
    ) -> None:
        super().__init__(name=f"logs-{container.name}", daemon=True)
        self.container = container
        self.log_path = log_path
        self.echo = echo
        self.wake = wake
        self.chunks: list[str] = []
        self.received = 0  # characters read from the stream so far: the drain's progress
        self.echo_error: BaseException | None = None
        self.stream_error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: list[str] = []  # the line being read, in pieces
        pending_size = 0
        try:
            # A log that cannot be written (a full disk) is the run's error, raised by the
            # caller as any other: not a traceback from this thread.
            with self.log_path.open("w", encoding="utf-8") as log:
                for chunk in self.container.logs(stream=True, follow=True):
                    text = decoder.decode(chunk)
                    self.received += len(text)
                    cut = text.rfind("\n")
                    if cut < 0 and pending_size + len(text) < _LINE_LIMIT:
                        pending.append(text)
                        pending_size += len(text)
                        continue
                    if cut < 0:  # one endless line: pass it on in pieces
                        self._emit(log, "".join([*pending, text]))
                        pending, pending_size = [], 0
                        continue
                    self._emit(log, "".join([*pending, text[: cut + 1]]))
                    rest = text[cut + 1 :]
                    pending, pending_size = ([rest], len(rest)) if rest else ([], 0)
                pending.append(decoder.decode(b"", final=True))
                if "".join(pending):
                    self._emit(log, "".join(pending))
        except _EchoFailed:
            pass
        except Exception as exc:
            self.stream_error = exc
        finally:
            self.wake.set()

    def _emit(self, log: Any, text: str) -> None:
        with self._lock:
            if self._abandoned:
                return
            self.chunks.append(text)
            log.write(text)
            log.flush()
        if self.echo is not None:
            try:
                for line in text.splitlines():
                    self.echo(line)
            except BaseException as exc:
                self.echo_error = exc
                raise _EchoFailed from exc

    def catch_up(self) -> None:
        """Add what the follow stream missed: it can end before the engine has passed on the
        container's last bytes (seen under load with Docker 20.10: a last line without newline
        went missing). Called once the container has exited and the stream has ended."""
        full = self.container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
        have = self.output
        if len(full) <= len(have) or not full.startswith(have):
            return
        with self.log_path.open("a", encoding="utf-8") as log, contextlib.suppress(_EchoFailed):
            self._emit(log, full[len(have) :])

    def read_back(self) -> None:
        """The whole output read again from the engine, into the log and `output`, when the
        stream stalled after the container exited (the pump writes nothing from here on): a
        verdict must never come from part of the output."""
        with self._lock:
            self._abandoned = True
        full = self.container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
        self.log_path.write_text(full, encoding="utf-8")
        self.chunks = [full]

    @property
    def output(self) -> str:
        return "".join(self.chunks)


class _EchoFailed(Exception):
    pass


class _Waiter(threading.Thread):
    """Blocks on the engine's wait so the main thread stays free to notice Ctrl-C and timeouts."""

    def __init__(self, container: Container, wake: threading.Event) -> None:
        super().__init__(name=f"wait-{container.name}", daemon=True)
        self.container = container
        self.wake = wake
        self.done = threading.Event()
        self.status: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.status = self.container.wait()
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()
            self.wake.set()


def _supervise(
    container: Container,
    log_path: Path,
    timeout: float | None,
    echo: Callable[[str], None] | None,
    cancel: threading.Event | None = None,
) -> ContainerResult:
    wake = threading.Event()
    container.start()
    started = time.monotonic()
    pump = _LogPump(container, log_path, echo, wake)
    waiter = _Waiter(container, wake)
    pump.start()
    waiter.start()
    deadline = None if timeout is None else started + timeout
    timed_out = False
    while not waiter.done.is_set():
        if pump.echo_error is not None:
            raise pump.echo_error
        if cancel is not None and cancel.is_set():
            _kill(container)
            waiter.done.wait(_GRACE_SECONDS)
            raise Cancelled("stopped: the session no longer needs it")
        if deadline is not None and time.monotonic() >= deadline:
            timed_out = _kill(container)
            waiter.done.wait(_GRACE_SECONDS)
            break
        wake.wait(_POLL_SECONDS)
        wake.clear()
    seconds = time.monotonic() - started
    # The stream can lag the exit by a lot of output: wait while it still brings some.
    while pump.is_alive():
        before = pump.received
        pump.join(_GRACE_SECONDS)
        if pump.received == before:
            break
    if pump.echo_error is not None:
        raise pump.echo_error
    if waiter.error is not None and not timed_out:
        raise waiter.error
    if pump.stream_error is not None and not timed_out:
        raise pump.stream_error
    if not pump.is_alive() and pump.stream_error is None:
        pump.catch_up()
        if pump.echo_error is not None:
            raise pump.echo_error
    elif pump.is_alive() and not timed_out:
        try:
            pump.read_back()
        except ENGINE_ERRORS as exc:
            raise InfrastructureError(
                f"the output of {container.name} stopped coming after it exited and could not "
                f"be read back ({_one_line(exc)}); not a verdict"
            ) from exc
    container.reload()
    state = container.attrs.get("State", {})
    exit_code = None
    if not timed_out:
        exit_code = (waiter.status or {}).get("StatusCode", state.get("ExitCode"))
    return ContainerResult(
        exit_code=exit_code,
        timed_out=timed_out,
        oom_killed=bool(state.get("OOMKilled", False)),
        seconds=seconds,
        log_path=log_path,
        output=pump.output,
    )


def _kill(container: Container) -> bool:
    """Kill a container that ran out of time; False when it had already exited by itself."""
    try:
        container.kill()
    except docker.errors.APIError:
        container.reload()
        if container.status == "running":
            raise
        return False
    return True


def _remove(
    client: docker.DockerClient, container: Container | None, name: str, *, quiet: bool
) -> None:
    """Force-remove by object or, when create was interrupted before returning, by name."""
    try:
        target = container if container is not None else client.containers.get(name)
        target.remove(force=True)
    except docker.errors.NotFound:
        return
    except ENGINE_ERRORS as exc:
        if quiet:
            return
        raise InfrastructureError(
            f"could not remove container {name} ({_one_line(exc)}); remove it with "
            f"`docker rm -f {name}`"
        ) from exc


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "explanation", None) or str(exc) or type(exc).__name__
    return re.sub(r"\s+", " ", str(text)).strip()
