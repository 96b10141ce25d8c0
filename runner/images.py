"""Per-commit test images: the base (CANN) image plus the wheels of one pypto/simpler pair.

Images are built with the legacy builder (docker-py has no BuildKit) from a Jinja2 template.
Everything that decides an image's content is written into its labels, so an image built by an
earlier run, or an earlier step of this one, is found by label and reused instead of rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import docker
import docker.errors
import jinja2
import requests.exceptions

import runner
from runner.errors import BadInput, BisectError, InfrastructureError
from runner.execute import LABEL
from runner.turns import Turns
from runner.wheels import file_sha256

TEMPLATE_NAME = "test-image.Dockerfile.j2"
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


def _template_text(name: str = TEMPLATE_NAME) -> str:
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


def template_digest() -> str:
    """Part of every image's identity: editing the template must not reuse older images."""
    return hashlib.sha256(_template_text().encode()).hexdigest()


def _dockerfile_string(value: object) -> str:
    return json.dumps(str(value))


def render_dockerfile(
    *,
    base_image_ref: str,
    simpler_wheel: str | None,
    pypto_wheel: str,
    labels: Mapping[str, str],
    base_user: str | None = None,
    pip_wheel: str | None = None,
    pypto_first: bool = False,
) -> str:
    """The Dockerfile text; wheels are file names inside the build context's `wheels/` folder.

    Each wheel is its own layer, simpler's first unless `pypto_first`: the one that earlier
    images of the session share goes first, so their build reuses its layer.

    `pip_wheel`: a pip wheel to install with, for a base image without pip.

    `base_user` is the base image's USER when it is not root: pip installs as root, then the
    image switches back so the runner's commands see the user the base image intended.
    """
    for name in (simpler_wheel, pypto_wheel, pip_wheel):
        if name is not None and (not name.endswith(".whl") or "/" in name or " " in name):
            raise BisectError(f"not a wheel file name: {name!r}")
    return render_template(
        TEMPLATE_NAME,
        base_image_ref=base_image_ref,
        wheels=[
            wheel
            for wheel in (
                (pypto_wheel, simpler_wheel) if pypto_first else (simpler_wheel, pypto_wheel)
            )
            if wheel is not None
        ],
        labels=dict(labels),
        base_user=base_user,
        pip_wheel=pip_wheel,
        pip=f"python3 /tmp/bisect-pip/{pip_wheel}/pip" if pip_wheel else "python3 -m pip",
    )


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


def image_tag(pypto_sha: str, simpler_sha: str | None) -> str:
    return f"{IMAGE_REPOSITORY}:{pypto_sha[:12]}-{simpler_sha[:12] if simpler_sha else 'none'}"


def image_labels(
    *,
    base_image_id: str,
    pypto_sha: str,
    pypto_wheel_sha256: str,
    simpler_sha: str | None,
    simpler_wheel_sha256: str | None,
) -> dict[str, str]:
    """Everything that decides the image's content; equal labels mean an equal image."""
    return {
        LABEL: "1",
        f"{LABEL}.pypto": pypto_sha,
        f"{LABEL}.simpler": simpler_sha or "none",
        f"{LABEL}.base-image": base_image_id,
        f"{LABEL}.template": template_digest(),
        f"{LABEL}.pypto-wheel": pypto_wheel_sha256,
        f"{LABEL}.simpler-wheel": simpler_wheel_sha256 or "none",
    }


def find_test_image(client: docker.DockerClient, labels: Mapping[str, str]) -> str | None:
    """The id of an existing image carrying all these labels, if any."""
    filters = {"label": [f"{name}={value}" for name, value in labels.items()]}
    try:
        found = client.images.list(filters=filters)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot list images from the Docker Engine: {exc}") from exc
    return found[0].id if found else None


def base_user(client: docker.DockerClient, base_image: str, base_image_id: str) -> str | None:
    try:
        attrs = client.images.get(base_image_id).attrs
    except docker.errors.ImageNotFound as exc:
        raise InfrastructureError(
            f"base image {base_image} ({base_image_id[:19]}) is no longer in the Docker Engine; "
            "load it again (or start a new bisect against the image you have now)"
        ) from exc
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot inspect base image {base_image}: {exc}") from exc
    user = (attrs.get("Config") or {}).get("User") or ""
    return None if user in ("", "root", "0", "0:0") else user


def _stage_wheel(wheel: Path, into: Path) -> None:
    target = into / wheel.name
    try:
        os.link(wheel, target)
    except OSError:
        shutil.copyfile(wheel, target)


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
) -> TestImage:
    """The test image for this pypto/simpler pair: reused when one with equal labels exists.

    A `speculative` image (layered ahead of need) waits while a test waits for its own.

    `pip_wheel` installs the wheels when the base image has no pip (the image keeps none).
    `pypto_first` layers pypto's wheel before simpler's (see `render_dockerfile`); an image
    with equal labels is reused whatever its order, since the order changes no file in it.

    The image is pinned to the base image *id*, so a base tag moved mid-bisect cannot mix two
    environments into one bisect.
    """
    if (simpler_sha is None) != (simpler_wheel is None):
        raise BisectError("give both simpler_sha and simpler_wheel, or neither")
    started = time.monotonic()
    tag = image_tag(pypto_sha, simpler_sha)
    try:
        labels = image_labels(
            base_image_id=base_image_id,
            pypto_sha=pypto_sha,
            pypto_wheel_sha256=file_sha256(pypto_wheel),
            simpler_sha=simpler_sha,
            simpler_wheel_sha256=file_sha256(simpler_wheel) if simpler_wheel else None,
        )
    except OSError as exc:
        raise InfrastructureError(f"cannot read a wheel from the cache: {exc}") from exc
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # One image build at a time in this process: Docker 20.10's legacy builder loses shared
    # layers when two builds of one base run at once, and a prefetch may be layering this
    # very image already (then it is reused below).
    with _BUILDS.turn(speculative):
        existing = find_test_image(client, labels)
        if existing is not None:
            _ensure_tag(client, existing, tag)
            with log_path.open("a") as handle:
                handle.write(f"reusing test image {tag} ({existing})\n")
            return TestImage(image_id=existing, tag=tag, reused=True, seconds=0.0)

        dockerfile = render_dockerfile(
            base_image_ref=base_image_id,
            simpler_wheel=simpler_wheel.name if simpler_wheel else None,
            pypto_wheel=pypto_wheel.name,
            labels=labels,
            base_user=base_user(client, base_image, base_image_id),
            pip_wheel=pip_wheel.name if pip_wheel else None,
            pypto_first=pypto_first,
        )
        context = Path(tempfile.mkdtemp(prefix="bisect-precision-image-"))
        try:
            (context / "wheels").mkdir()
            (context / "Dockerfile").write_text(dockerfile)
            for wheel in (simpler_wheel, pypto_wheel, pip_wheel):
                if wheel is not None:
                    _stage_wheel(wheel, context / "wheels")
            with log_path.open("a") as handle:
                image_id = _build(
                    client,
                    context,
                    tag=tag,
                    handle=handle,
                    echo=echo,
                    pypto=(pypto_sha, pypto_wheel.name),
                    simpler=(simpler_sha, simpler_wheel.name)
                    if simpler_sha and simpler_wheel
                    else None,
                    base_image=base_image,
                    log_path=log_path,
                )
        except OSError as exc:
            raise InfrastructureError(f"cannot prepare the image build context: {exc}") from exc
        finally:
            shutil.rmtree(context, ignore_errors=True)
        seconds = time.monotonic() - started
        return TestImage(image_id=image_id, tag=tag, reused=False, seconds=seconds)


def _ensure_tag(client: docker.DockerClient, image_id: str, tag: str) -> None:
    repository, _, version = tag.rpartition(":")
    try:
        image = client.images.get(image_id)
        if tag not in image.tags:
            image.tag(repository, version)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"cannot tag image {image_id[:19]} as {tag}: {exc}") from exc


_BUILDS = Turns()
_RUN_FAILED = "returned a non-zero code"  # the legacy builder's message for a failing RUN


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
) -> _Streamed:
    """Run a legacy-builder build, streaming its log; engine failures are infrastructure."""
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

    try:
        stream = client.api.build(
            path=str(context),
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
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
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        emit(f"ERROR: {exc}\n")
        raise InfrastructureError(
            f"building {what} failed in the Docker Engine: {exc}; check the engine "
            f"and resume (log: {log_path})"
        ) from exc
    finally:
        if pending:
            emit("\n")
        handle.flush()

    if error is None and image_id is None:
        with contextlib.suppress(docker.errors.DockerException):
            image_id = client.images.get(tag).id
    if error is not None or image_id is None:
        _remove_partial_build(client, lines)
    return _Streamed(image_id if error is None else None, lines, error, step)


def build_image(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    log_path: Path,
    what: str,
    echo: Echo | None = None,
) -> str:
    """Build an image whose failure stops the run (a builder image, say); returns its id."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as handle:
        result = _stream_build(
            client, context, tag=tag, handle=handle, echo=echo, what=what, log_path=log_path
        )
    if result.image_id is not None:
        return result.image_id
    tail = _tail(result.lines)
    if "no space left on device" in tail.lower():
        raise InfrastructureError(
            f"building {what} ran out of disk space; free space and resume (log: {log_path})"
        )
    last = tail.splitlines()[-1] if tail else "no output"
    raise BadInput(
        f"building {what} failed: {last[:200]}; the base image must accept these wheels "
        f"(log: {log_path})"
    )


def _build(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    handle: TextIO,
    echo: Echo | None,
    pypto: tuple[str, str],
    simpler: tuple[str, str] | None,
    base_image: str,
    log_path: Path,
) -> str:
    streamed = _stream_build(
        client,
        context,
        tag=tag,
        handle=handle,
        echo=echo,
        what=f"test image {tag}",
        log_path=log_path,
    )
    if streamed.image_id is not None:
        return streamed.image_id
    lines, step = streamed.lines, streamed.step
    tail = _tail(lines)
    failed_wheel = None
    # Only pip's own failure blames a wheel; an engine error in that step (a lost layer, a
    # full disk) says nothing about the commit.
    pip_failed = _RUN_FAILED in (streamed.error or "")
    for candidate in (simpler, pypto):
        if candidate and pip_failed and "pip install" in step and candidate[1] in step:
            failed_wheel = candidate
    out_of_space = "no space left on device" in tail.lower()
    if failed_wheel is not None and not out_of_space:
        sha, wheel = failed_wheel
        package = "simpler" if failed_wheel is simpler else "pypto"
        raise WheelInstallFailed(
            f"the {package} wheel {wheel} of {sha[:12]} does not install into {base_image}: the "
            f"wheel itself is broken, so this commit is untestable (log: {log_path})\n{tail}",
            package=package,
            commit=sha,
        )
    raise InfrastructureError(
        f"building test image {tag} from {base_image} failed, and not because of a wheel: an "
        f"infrastructure problem (engine, disk or base image); fix it and resume "
        f"(log: {log_path})\n{tail}"
    )
