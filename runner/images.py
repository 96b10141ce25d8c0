"""Per-commit test images: the base (CANN) image plus the wheels of one pypto/simpler pair.

Test images are committed from containers that pip-install one wheel each (`_Layering`), so a
process makes several at once; builder images are built from the Jinja2 templates in
`dockerfiles/` with the legacy builder (docker-py has no BuildKit). Everything that decides an
image's content is written into its labels, so an image made by an earlier run, or an earlier
step of this one, is found by label and reused instead of made again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import re
import shlex
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import docker
import docker.errors
import jinja2
import requests.exceptions
import urllib3.exceptions

import runner
from runner.containers import ContainerResult, ContainerSpec, Mount
from runner.errors import BadInput, BisectError, InfrastructureError
from runner.execute import (
    ENGINE_ERRORS,
    KIND_LABEL,
    LABEL,
    OWNER_LABEL,
    PROCESS_LABEL,
    RUN_LABEL,
    Cancelled,
    run_container,
)
from runner.install import SHADOWED, SHADOWED_EXIT, WHEEL_INSTALLER, install_command
from runner.turns import Turns
from runner.wheels import file_sha256

if TYPE_CHECKING:
    from docker.models.containers import Container
    from docker.models.images import Image

IMAGE_REPOSITORY = "bisect-precision/pypto"
_LOG_TAIL_LINES = 15

Echo = Callable[[str], None]


class WheelInstallFailed(BisectError):
    """A wheel built, but pip refuses to install it: the commit is untestable, not the engine.

    The session should record the commit as skipped rather than abort the bisect.
    """

    exit_code = 2

    def __init__(self, message: str, *, package: str, commit: str) -> None:
        super().__init__(message)
        self.package = package
        self.commit = commit


@dataclass(frozen=True)
class TestImage:
    __test__ = False  # not a pytest test class despite the name

    image_id: str
    tag: str
    reused: bool
    seconds: float


def _template_text(name: str) -> str:
    """From the source tree when running from a checkout, else from the installed package data."""
    checkout = Path(runner.__file__).resolve().parent.parent / "dockerfiles" / name
    if checkout.is_file():
        return checkout.read_text()
    packaged = importlib.resources.files("runner").joinpath("dockerfiles", name)
    if packaged.is_file():
        return packaged.read_text()
    raise InfrastructureError(
        f"the Dockerfile template {name} is not installed with the runner package; "
        "reinstall bisect-precision-docker (or run it from its source checkout)"
    )


def _dockerfile_string(value: object) -> str:
    return json.dumps(str(value))


def render_template(name: str, **values: object) -> str:
    """Render one of the shipped Dockerfile templates; `dq` quotes a value for Dockerfile text."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dq"] = _dockerfile_string
    return env.from_string(_template_text(name)).render(**values)


def image_tag(
    pypto_sha: str, simpler_sha: str | None, base_image_id: str, python: str = "python3"
) -> str:
    """The name a test image is made under: its commits, base image and interpreter (when not
    python3), so the same pair tested on another base (a CANN upgrade, say) or with another
    --python does not take the tag and leave the first image nameless."""
    base = base_image_id.split(":")[-1][:12]
    simpler = simpler_sha[:12] if simpler_sha else "none"
    interpreter = (
        "" if python == "python3" else f"-{hashlib.sha256(python.encode()).hexdigest()[:8]}"
    )
    return f"{IMAGE_REPOSITORY}:{pypto_sha[:12]}-{simpler}-{base}{interpreter}"


def image_labels(
    *,
    base_image_id: str,
    pypto_sha: str,
    pypto_wheel_sha256: str,
    simpler_sha: str | None,
    simpler_wheel_sha256: str | None,
    python: str = "python3",
) -> dict[str, str]:
    """Everything that decides the image's content; equal labels mean an equal image."""
    return {
        LABEL: "1",
        f"{LABEL}.pypto": pypto_sha,
        f"{LABEL}.simpler": simpler_sha or "none",
        f"{LABEL}.base-image": base_image_id,
        f"{LABEL}.recipe": recipe_digest(python),
        f"{LABEL}.pypto-wheel": pypto_wheel_sha256,
        f"{LABEL}.simpler-wheel": simpler_wheel_sha256 or "none",
    }


def list_images(client: docker.DockerClient, filters: Mapping[str, object]) -> list[Image]:
    """`images.list`, which inspects each image it lists: one removed meanwhile (a cleanup, a
    prune by another user) makes it fail, so it lists again."""
    for _ in range(4):
        try:
            return client.images.list(filters=dict(filters))
        except docker.errors.ImageNotFound:
            continue
    return client.images.list(filters=dict(filters))


def tagged_image(client: docker.DockerClient, tag: str) -> tuple[str, dict[str, str]] | None:
    """The id and labels of the image a tag names (one inspect), None when it names none."""
    try:
        named = client.api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return None
    except ENGINE_ERRORS as exc:
        raise InfrastructureError(f"cannot inspect image {tag}: {exc}") from exc
    return str(named["Id"]), (named.get("Config") or {}).get("Labels") or {}


def find_test_image(
    client: docker.DockerClient, labels: Mapping[str, str], tag: str | None = None
) -> str | None:
    """The id of an existing image carrying all these labels, if any.

    With `tag`, the name such an image is made under: the image it names is checked first (one
    inspect, where a listing by label scans every image in the engine). When the tag is missing
    nothing is listed, since an equal image would carry it; when it names another image (one
    made from other wheels of the same commits), the labels are searched.
    """
    if tag is not None:
        named = tagged_image(client, tag)
        if named is None:
            return None
        image_id, found = named
        if all(found.get(name) == value for name, value in labels.items()):
            return image_id
    filters = {"label": [f"{name}={value}" for name, value in labels.items()]}
    try:
        found = list_images(client, filters)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot list images from the Docker Engine: {exc}") from exc
    return found[0].id if found else None


def base_user_and_path(client: docker.DockerClient, base_image_id: str) -> tuple[str | None, str]:
    """The base image's USER when it is not root (pip installs as root, then it is restored),
    and the PATH its config sets ("" for none), from one inspection."""
    config = _base_config(client, base_image_id, base_image_id)
    return _non_root(config.user), config.path


def base_entrypoint(client: docker.DockerClient, image_id: str) -> list[str]:
    """The image's ENTRYPOINT ([] for none): what wraps every command its containers run."""
    return _base_config(client, image_id, image_id).entrypoint


def _non_root(user: str) -> str | None:
    return None if user in ("", "root", "0", "0:0") else user


_STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")


def _remove_partial_build(client: docker.DockerClient, lines: list[str]) -> None:
    """A failed build leaves its steps as untagged images; drop the chain no other image uses.

    Removing the last step also removes its untagged parents, but the engine stops at a parent
    that another image (or a concurrent build) still needs, so shared layers survive.
    """
    # The first step image is the base itself (FROM): never a candidate.
    steps = [match.group(1) for line in lines if (match := _STEP_IMAGE.match(line))][1:]
    if not steps:
        return
    with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
        image = client.images.get(steps[-1])
        if image.tags or image.labels.get(f"{LABEL}.pypto"):
            return
        # The failed step's container may still be on its way out (forcerm runs after the
        # error is streamed): the engine refuses with a conflict until it is gone.
        for _ in range(10):
            try:
                client.images.remove(image.id)
                return
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise
                time.sleep(0.5)


def _tail(lines: list[str]) -> str:
    return "\n".join([line for line in lines if line.strip()][-_LOG_TAIL_LINES:])


def ensure_test_image(
    client: docker.DockerClient,
    *,
    base_image: str,
    base_image_id: str,
    pypto_sha: str,
    pypto_wheel: Path,
    simpler_sha: str | None,
    simpler_wheel: Path | None,
    log_path: Path,
    echo: Echo | None = None,
    pip_wheel: Path | None = None,
    speculative: bool = False,
    pypto_first: bool = False,
    python: str = "python3",
) -> TestImage:
    """The test image for this pypto/simpler pair: reused when one with equal labels exists.

    Each wheel is one layer, committed from a container that pip-installs it (see `_layer`):
    images of one process are made in parallel, and one made ahead of need (`speculative`) waits
    while a test's own image is being made, one guess at a time. The wheel that earlier images
    share goes first (simpler's, or pypto's with `pypto_first`) and that layer is kept as its
    own image, so the next image of the pair's neighbourhood only adds the other wheel. An
    image with equal labels is reused whatever its order, since the order changes no file in it.

    `pip_wheel` installs the wheels when the base image has no pip (the image keeps none).
    `python`: the interpreter the wheels go into (the one builds and the example use).

    The image is pinned to the base image *id*, so a base tag moved mid-bisect cannot mix two
    environments into one bisect.
    """
    if (simpler_sha is None) != (simpler_wheel is None):
        raise BisectError("give both simpler_sha and simpler_wheel, or neither")
    started = time.monotonic()
    tag = image_tag(pypto_sha, simpler_sha, base_image_id, python)
    try:
        digests = {"pypto": file_sha256(pypto_wheel)}
        if simpler_wheel is not None:
            digests["simpler"] = file_sha256(simpler_wheel)
    except OSError as exc:
        raise InfrastructureError(f"cannot read a wheel from the cache: {exc}") from exc
    labels = image_labels(
        base_image_id=base_image_id,
        pypto_sha=pypto_sha,
        pypto_wheel_sha256=digests["pypto"],
        simpler_sha=simpler_sha,
        simpler_wheel_sha256=digests.get("simpler"),
        python=python,
    )
    order = [("pypto", pypto_sha, pypto_wheel)]
    if simpler_sha is not None and simpler_wheel is not None:
        simpler = ("simpler", simpler_sha, simpler_wheel)
        order = [*order, simpler] if pypto_first else [simpler, *order]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _TURNS.turn(speculative), _KEYS.hold(tag):
        existing = find_test_image(client, labels, tag)
        if existing is not None:
            _ensure_tag(client, existing, tag)
            with log_path.open("a") as handle:
                handle.write(f"reusing test image {tag} ({existing})\n")
            return TestImage(image_id=existing, tag=tag, reused=True, seconds=0.0)
        base = _base_config(client, base_image, base_image_id)
        layering = _Layering(
            client, base, pip_wheel, log_path, None if speculative else echo, python
        )
        parent = base_image_id
        if len(order) == 2:
            package, sha, wheel = order[0]
            parent = layering.shared(package, sha, wheel, digests[package])
        package, sha, wheel = order[-1]
        image_id = layering.layer(
            parent, package, sha, wheel, {**labels, KIND_LABEL: "test-image"}, tag
        )
        return TestImage(
            image_id=image_id, tag=tag, reused=False, seconds=time.monotonic() - started
        )


def _ensure_tag(client: docker.DockerClient, image_id: str, tag: str) -> None:
    repository, _, version = tag.rpartition(":")
    try:
        image = client.images.get(image_id)
        if tag not in image.tags:
            image.tag(repository, version)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot tag image {image_id[:19]} as {tag}: {exc}") from exc


class _KeyLocks:
    """One maker per image: a second thread wanting the same image waits, then reuses it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._mutex:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield


_TURNS = Turns()  # any number of needed images at once; one guess, only while none is made
_KEYS = _KeyLocks()

LAYER_REPOSITORY = "bisect-precision/layer"
_WHEELS_DIR = "/tmp/bisect-wheels"
_PIP_DIR = "/tmp/bisect-pip"
# How a wheel becomes a layer; part of every image's identity (the `recipe` label), so a
# change here never reuses an image made the old way.
_PIP_ENVIRONMENT = {
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
    # Everything pip needs is on its command line: the image's pip.conf (`user = true`,
    # `require-virtualenv`) would put the wheel where no run imports it, or refuse.
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_USER": "0",
    "PIP_REQUIRE_VIRTUALENV": "0",
}
_LAYER_TIMEOUT_S = 1800.0
# Owner labels mark the layering container (for the stale-container sweep); an image made from
# it must not claim an owner process, and a commit can only override a label, not drop it.
_CONTAINER_ONLY_LABELS = (OWNER_LABEL, RUN_LABEL, PROCESS_LABEL)


def recipe_digest(python: str = "python3") -> str:
    """Part of every image's identity: changing how wheels are layered, or the interpreter they
    go into, never reuses old images."""
    recipe = {
        "install": install_command("{pip}", "{wheel}", python),
        "environment": _PIP_ENVIRONMENT,
        "layers": "one per wheel",
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class _BaseConfig:
    """What of the base image's config a committed layer must keep as it was."""

    image: str
    image_id: str
    entrypoint: list[str]
    cmd: list[str] | None
    user: str
    labels: dict[str, str]
    path: str  # the PATH its Env sets, "" for none


def _base_config(client: docker.DockerClient, base_image: str, base_image_id: str) -> _BaseConfig:
    try:
        config = client.images.get(base_image_id).attrs.get("Config") or {}
    except docker.errors.ImageNotFound as exc:
        raise InfrastructureError(
            f"base image {base_image} ({base_image_id[:19]}) is no longer in the Docker Engine; "
            "load it again (or start a new bisect against the image you have now)"
        ) from exc
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot inspect base image {base_image}: {exc}") from exc
    return _BaseConfig(
        image=base_image,
        image_id=base_image_id,
        entrypoint=list(config.get("Entrypoint") or []),
        cmd=list(config["Cmd"]) if config.get("Cmd") else None,
        user=config.get("User") or "",
        labels=dict(config.get("Labels") or {}),
        path=next(
            (v.split("=", 1)[1] for v in config.get("Env") or [] if v.startswith("PATH=")), ""
        ),
    )


class _Layering:
    """Commits wheels as layers: a container pip-installs one wheel, bind-mounted read-only, and
    is committed with the base image's entrypoint, command and user put back.

    Containers are independent of each other, unlike the legacy builder's shared step cache, so
    images are made in parallel; and a layer costs one container, not a COPY and a RUN step.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        base: _BaseConfig,
        pip_wheel: Path | None,
        log_path: Path,
        echo: Echo | None,
        python: str = "python3",
    ) -> None:
        self.client = client
        self.base = base
        self.python = python
        self.pip_wheel = pip_wheel
        self.log_path = log_path
        self.echo = echo

    def shared(self, package: str, sha: str, wheel: Path, digest: str) -> str:
        """The image of the base plus this one wheel, kept for the images that share it."""
        labels = {
            LABEL: "1",
            KIND_LABEL: "layer",
            f"{LABEL}.layer-package": package,
            f"{LABEL}.layer-commit": sha,
            f"{LABEL}.layer-wheel": digest,
            f"{LABEL}.base-image": self.base.image_id,
            f"{LABEL}.recipe": recipe_digest(self.python),
        }
        tag = f"{LAYER_REPOSITORY}:{package}-{digest[:12]}-{self.base.image_id[7:19]}"
        with _KEYS.hold(tag):
            # Test images made on it inherit these labels but say kind=test-image.
            existing = find_test_image(self.client, labels, tag)
            if existing is not None:
                with self.log_path.open("a") as handle:
                    handle.write(f"reusing layer {tag} ({existing})\n")
                return existing
            return self.layer(self.base.image_id, package, sha, wheel, labels, tag)

    def layer(
        self,
        parent: str,
        package: str,
        sha: str,
        wheel: Path,
        labels: Mapping[str, str],
        tag: str,
    ) -> str:
        """Install `wheel` on `parent`; commit the result as `tag`; return the image id."""
        mounts = [Mount(str(wheel.parent), _WHEELS_DIR)]
        python = shlex.quote(self.python)
        pip = f"{python} -m pip"
        if self.pip_wheel is not None:
            mounts.append(Mount(str(self.pip_wheel.parent), _PIP_DIR))
            pip = f"{python} {_PIP_DIR}/{self.pip_wheel.name}/pip"
        command = install_command(pip, f"{_WHEELS_DIR}/{wheel.name}", python)
        # Through the image's entrypoint, as builds and runs go: the Python it puts first on
        # PATH (CANN's set_env.sh) is the one the example imports the wheel with.
        spec = ContainerSpec(
            image=parent,
            command=["/bin/sh", "-c", command],
            environment=dict(_PIP_ENVIRONMENT),
            mounts=mounts,
            labels={KIND_LABEL: "layer"},
            user="root" if _non_root(self.base.user) else None,
        )
        committed: list[str] = []

        def commit(container: Container, result: ContainerResult) -> None:
            if result.exit_code == 0 and not result.timed_out and not result.oom_killed:
                committed.append(self._commit(container, labels, tag))

        pip_log = self.log_path.with_name(f"{self.log_path.stem}-{package}.log")
        with self.log_path.open("a") as handle:
            handle.write(f"layering {package} {sha[:12]} ({wheel.name}) on {parent[:19]}\n")
            shown = command.replace(shlex.quote(WHEEL_INSTALLER), '"$WHEEL_INSTALLER"')
            handle.write(f"$ {shown}  (output: {pip_log.name})\n")
        result = run_container(
            self.client,
            spec,
            log_path=pip_log,
            timeout=_LAYER_TIMEOUT_S,
            echo=self.echo,
            before_removal=commit,
        )
        if committed:
            with self.log_path.open("a") as handle:
                handle.write(f"committed {tag} ({committed[0]})\n")
            return committed[0]
        raise self._failure(result, package, sha, wheel, pip_log)

    def _commit(self, container: Container, labels: Mapping[str, str], tag: str) -> str:
        repository, _, version = tag.rpartition(":")
        conf = {
            # [] rather than nothing: the engine would keep the layering command otherwise.
            "Entrypoint": self.base.entrypoint,
            "Cmd": self.base.cmd,
            "User": self.base.user,
            "Labels": {
                **{name: "" for name in _CONTAINER_ONLY_LABELS},
                **self.base.labels,
                **labels,
            },
        }
        response = self.client.api.commit(
            container.id, repository=repository, tag=version, conf=conf
        )
        return str(response["Id"])

    def _failure(
        self, result: ContainerResult, package: str, sha: str, wheel: Path, log: Path
    ) -> BisectError:
        tail = _tail(result.output.splitlines())
        shadowed = next(
            (
                ln.split(maxsplit=2)[1:]
                for ln in result.output.splitlines()
                if ln.startswith(SHADOWED)
            ),
            None,
        )
        if result.exit_code == SHADOWED_EXIT and shadowed:
            top, where = [*shadowed, "-", "-"][:2]
            if where == "-":
                # The layer installer writes only where the interpreter imports from, and says
                # where; else pip installed it, as the image's pip is set up to.
                ours = f" from {wheel.name} into "
                into = next((ln for ln in result.output.splitlines() if ours in ln), "")
                how = (
                    f"the wheel is in {into.split(ours)[1]}, which it imports from, so something "
                    "the image sets up (an import hook, a .pth file) hides it there"
                    if into.startswith("installed ")
                    else "pip put the wheel where that interpreter does not look; make pip there "
                    f"install into a directory on `{self.python}`'s sys.path (look for a "
                    "pip.conf, PIP_TARGET, PIP_PREFIX or PIP_USER in the image)"
                )
                return BadInput(
                    f"after installing the {package} wheel of {sha[:12]} into {self.base.image}, "
                    f"`{self.python}` there cannot import {top}: {how} (log: {log})"
                )
            return BadInput(
                f"{self.base.image} has its own {top} at {where}, which `{self.python}` imports "
                f"instead of the tested {package} wheel of {sha[:12]}: every test would run that "
                "copy; remove it from the base image (or from its PYTHONPATH)"
            )
        if result.timed_out or result.oom_killed or "no space left on device" in tail.lower():
            why = "timed out" if result.timed_out else "ran out of memory or disk"
            return InfrastructureError(
                f"installing the {package} wheel of {sha[:12]} into {self.base.image} {why}: an "
                f"infrastructure problem; fix it and resume (log: {log})\n{tail}"
            )
        if result.exit_code in (126, 127) or (result.exit_code or 0) >= 128:
            return InfrastructureError(
                f"{self.base.image} cannot run pip (exit {result.exit_code}) to install the "
                f"{package} wheel of {sha[:12]}; not a verdict (log: {log})\n{tail}"
            )
        return WheelInstallFailed(
            f"the {package} wheel {wheel.name} of {sha[:12]} does not install into "
            f"{self.base.image}: the wheel itself is broken, so this commit is untestable "
            f"(log: {log})\n{tail}",
            package=package,
            commit=sha,
        )


class BuildCutter:
    """Cuts the engine connections of the image builds in flight when a run stops.

    A legacy build streams its log over one HTTP response until the image is made, and a
    thread reading that stream waits for the build to end, as a stopping process waits for its
    threads. `stop` half-closes those connections instead: the engine takes the client as gone,
    cancels the build (killing and removing the step's container), says so on the stream and
    closes it, so the reading thread reads the steps made so far (for `_remove_partial_build`)
    and raises `Cancelled`. A connection the engine leaves open is shut both ways after
    `_HARD_CUT_SECONDS`. A build asked for after the stop is not started.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopped = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            open_now = list(self._open)
        for sock in open_now:
            _hang_up(sock)
        if open_now:
            timer = threading.Timer(_HARD_CUT_SECONDS, self._cut_hard)
            timer.daemon = True
            timer.start()

    def _cut_hard(self) -> None:
        with self._lock:
            open_now = list(self._open)
        for sock in open_now:
            _hang_up(sock, how=socket.SHUT_RDWR)

    @contextlib.contextmanager
    def watching(self, client: docker.DockerClient) -> Iterator[Callable[[], None]]:
        """While inside, the build request this thread sends is cut by `stop`; the function
        yielded registers the response the request got (call it once the build started)."""
        sink = _sink_for(client)
        sink.responses = []
        held: list[socket.socket] = []

        def started() -> None:
            responses, sink.responses = sink.responses, None
            sock = _response_socket(responses[-1]) if responses else None  # the build's own
            if sock is None:
                return
            with self._lock:
                self._open.add(sock)
                held.append(sock)
                if self._stopped.is_set():
                    _hang_up(sock)

        try:
            if self._stopped.is_set():
                raise Cancelled("the run is stopping")
            yield started
        finally:
            sink.responses = None
            with self._lock:
                self._open.difference_update(held)


class _Sink(threading.local):
    responses: list[requests.Response] | None = None


_SINKS: weakref.WeakKeyDictionary[object, _Sink] = weakref.WeakKeyDictionary()
_SINKS_LOCK = threading.Lock()


def _sink_for(client: docker.DockerClient) -> _Sink:
    """A per-thread sink for the responses of `client`'s requests, fed by a hook on its
    session (installed once per client): only a thread that set its sink collects."""
    with _SINKS_LOCK:
        sink = _SINKS.get(client.api)
        if sink is None:
            sink = _Sink()

            def collect(response: requests.Response, *_args: object, **_kwargs: object) -> None:
                if sink.responses is not None:
                    sink.responses.append(response)

            client.api.hooks.setdefault("response", []).append(collect)
            _SINKS[client.api] = sink
        return sink


def _response_socket(response: requests.Response) -> socket.socket | None:
    """The socket under a streamed response (docker-py reads attached streams the same way)."""
    raw = getattr(getattr(getattr(response.raw, "_fp", None), "fp", None), "raw", None)
    sock = getattr(raw, "_sock", raw)
    return sock if isinstance(sock, socket.socket) else None


_HARD_CUT_SECONDS = 5.0


def _hang_up(sock: socket.socket, how: int = socket.SHUT_WR) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(how)


@dataclass
class _Streamed:
    image_id: str | None
    lines: list[str]
    error: str | None
    step: str


def _stream_build(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    handle: TextIO,
    echo: Echo | None,
    what: str,
    log_path: Path,
    cutter: BuildCutter | None = None,
) -> _Streamed:
    """Run a legacy-builder build, streaming its log; engine failures are infrastructure, and
    a build `cutter` stops raises `Cancelled`."""
    lines: list[str] = []
    pending = ""
    step = ""
    image_id: str | None = None
    error: str | None = None

    def emit(text: str) -> None:
        nonlocal pending, step
        handle.write(text)
        pending += text
        *complete, pending = pending.split("\n")
        for line in complete:
            lines.append(line)
            if line.startswith("Step "):
                step = line
            if echo and line.strip():
                echo(line)

    cutter = cutter or BuildCutter()
    try:
        with cutter.watching(client) as started:
            stream = client.api.build(
                path=str(context),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode="none",  # everything comes from the context, as in every container
            )
            started()
            for chunk in stream:
                if "stream" in chunk:
                    emit(chunk["stream"])
                elif "error" in chunk:
                    error = str(chunk.get("errorDetail", {}).get("message") or chunk["error"])
                    emit(f"ERROR: {error}\n")
                elif "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
                elif "status" in chunk:
                    emit(f"{chunk['status']}\n")
    except (
        docker.errors.DockerException,
        requests.exceptions.RequestException,
        urllib3.exceptions.HTTPError,  # a connection lost mid-stream, which requests leaves be
        OSError,
    ) as exc:
        if cutter.stopped:
            raise _stopped(client, what, lines, emit) from exc
        emit(f"ERROR: {exc}\n")
        raise InfrastructureError(
            f"building {what} failed in the Docker Engine: {exc}; check the engine "
            f"and resume (log: {log_path})"
        ) from exc
    finally:
        if pending:
            emit("\n")
        handle.flush()

    if cutter.stopped and image_id is None:
        raise _stopped(client, what, lines, emit)
    if error is None and image_id is None:
        with contextlib.suppress(docker.errors.DockerException):
            image_id = client.images.get(tag).id
    if error is not None or image_id is None:
        _remove_partial_build(client, lines)
    return _Streamed(image_id if error is None else None, lines, error, step)


def _stopped(
    client: docker.DockerClient, what: str, lines: list[str], emit: Callable[[str], None]
) -> Cancelled:
    """A build cut by a stopping run: the engine removes the step's container, the steps made
    before it go as a failed build's do."""
    emit("stopped: the run is stopping\n")
    _remove_partial_build(client, lines)
    return Cancelled(f"building {what} stopped: the run is stopping")


def build_image(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    log_path: Path,
    what: str,
    echo: Echo | None = None,
    cutter: BuildCutter | None = None,
) -> str:
    """Build an image whose failure stops the run (a builder image, say); returns its id."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as handle:
        result = _stream_build(
            client,
            context,
            tag=tag,
            handle=handle,
            echo=echo,
            what=what,
            log_path=log_path,
            cutter=cutter,
        )
    if result.image_id is not None:
        return result.image_id
    tail = _tail(result.lines)
    if "no space left on device" in tail.lower():
        raise InfrastructureError(
            f"building {what} ran out of disk space; free space and resume (log: {log_path})"
        )
    raise BadInput(
        f"building {what} failed: {_cause(result.lines)[:200]}; the base image must accept these "
        f"wheels (log: {log_path})"
    )


_DOCKER_EPILOGUE = re.compile(
    r"^(?:ERROR: )?(The command .* returned a non-zero code|Removing intermediate container|"
    r"Step \d+/\d+| ---> )"
)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _cause(lines: list[str]) -> str:
    """The line of a failed build that says why: the last one naming an error, not Docker's
    closing 'returned a non-zero code' (which only says that a step failed)."""
    plain = [_COLOUR.sub("", line).strip() for line in lines]  # pip colours its errors
    said = [line for line in plain if line and not _DOCKER_EPILOGUE.match(line)]
    errors = [line for line in said if "error" in line.lower()]
    return (errors or said or ["no output"])[-1]


@dataclass(frozen=True)
class Removed:
    """What `remove_recorded` did: images removed, kept for a running container, and layers
    kept because other images are made on them."""

    removed: int = 0
    in_use: int = 0
    shared: int = 0


def remove_recorded(client: docker.DockerClient, image_ids: Collection[str]) -> Removed:
    """Remove these test images (the ones a workdir's ledger recorded), then the tool's layers
    they were made on that no other image is made on. Images the tool did not make are never
    touched, whatever the ledger says; an image a running container uses stays."""
    removed = in_use = shared = 0
    layers: list[str] = []  # children before their parents
    for image_id in image_ids:
        image = _image_or_none(client, image_id)
        if image is None or image.labels.get(LABEL) != "1":
            continue
        above = _image_or_none(client, image.attrs.get("Parent"))
        while above is not None and above.labels.get(KIND_LABEL) == "layer":
            if above.id in layers:
                break
            layers.append(above.id)
            above = _image_or_none(client, above.attrs.get("Parent"))
        outcome = remove_image(client, image.id)
        removed += outcome == "removed"
        in_use += outcome == "kept"
    for layer in layers:
        # Not forced: a layer other images are made on (another workdir's) must stay.
        outcome = remove_image(client, layer, force=False)
        removed += outcome == "removed"
        shared += outcome == "kept"
    return Removed(removed, in_use, shared)


def _image_or_none(client: docker.DockerClient, image_id: str | None) -> Image | None:
    """The image with this id; None for no id (an image without a parent) or one removed."""
    if not image_id:
        return None
    try:
        return client.images.get(image_id)
    except docker.errors.ImageNotFound:
        return None


def remove_image(client: docker.DockerClient, image_id: str, *, force: bool = True) -> str:
    """Remove one image: "removed", "gone" (someone was first) or "kept" when the engine
    refuses (409): a running container uses it or, unforced, other images are made on it."""
    try:
        client.images.remove(image_id, force=force)
    except docker.errors.ImageNotFound:
        return "gone"
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        return "kept"
    return "removed"
