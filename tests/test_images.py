"""Test images hold one pypto/simpler pair on top of the base image, and are reused when equal."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest

from runner.containers import ContainerSpec, Mount
from runner.errors import BadInput
from runner.execute import LABEL, OWNER_LABEL, Cancelled, run_container
from runner.images import (
    LAYER_REPOSITORY,
    BuildCutter,
    TestImage,
    WheelInstallFailed,
    _cause,
    build_image,
    ensure_test_image,
    find_test_image,
    image_tag,
    recipe_digest,
)
from runner.sample.packages import write_pypto, write_simpler
from runner.wheels import BuildSettings, WheelCache, build_wheel
from tests.fixtures.docker import build_from_text

# Unique per test run, so images of concurrent runs never collide and cleanup finds only ours.
RUN = secrets.token_hex(4)
ENTRYPOINT_BASE = f"bisect-precision-test/entrypoint-base:{RUN}"
VENV_BASE = f"bisect-precision-test/venv-base:{RUN}"


def sha(name: str) -> str:
    """A commit-like SHA of this test run; distinct in its first 12 digits, as tags need."""
    return hashlib.sha1(f"{RUN}:{name}".encode()).hexdigest()


@dataclass(frozen=True)
class Wheels:
    simpler: Path
    simpler_2: Path
    pypto_1: Path
    pypto_2: Path
    pypto_alone: Path


@pytest.fixture(scope="module")
def base_image_id(setuptools_builder: str) -> str:
    """Wheels build in (and test images start from) a builder: the base has no build backend."""
    return setuptools_builder


@pytest.fixture(scope="module")
def wheels(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Wheels:
    cache_root = tmp_path_factory.mktemp("cache")
    cache = WheelCache(cache_root / "wheels")
    settings = BuildSettings(base_image=base_image, base_image_id=base_image_id, timeout=120)
    sources = {
        "simpler": lambda d: write_simpler(d, revision=1),
        "simpler_2": lambda d: write_simpler(d, revision=2),
        "pypto_1": lambda d: write_pypto(d, revision=1),
        "pypto_2": lambda d: write_pypto(d, revision=2, factor=1.5),
        "pypto_alone": lambda d: write_pypto(d, revision=0, uses_simpler=False),
    }
    built = {}
    for name, write in sources.items():
        package = "simpler" if name.startswith("simpler") else "pypto"
        result = build_wheel(
            docker_client,
            cache,
            package,
            sha(name),
            write,
            settings,
            ccache_dir=cache_root / "ccache",
        )
        assert result.ok and result.wheel is not None, result.reason
        built[name] = result.wheel
    return Wheels(**built)


@pytest.fixture(scope="module", autouse=True)
def remove_test_images(docker_client: docker.DockerClient) -> Iterator[None]:
    """Images are labelled with the pypto SHA; every SHA of this module starts with RUN."""
    yield
    names = (
        "pypto_1",
        "pypto_2",
        "pypto_alone",
        "broken",
        "parallel-pypto_1",
        "parallel-pypto_2",
        "retagged",
    )
    for name in names:
        for image in docker_client.images.list(filters={"label": f"{LABEL}.pypto={sha(name)}"}):
            docker_client.images.remove(image.id, force=True)
    # Then the shared layers those images were made on (their children are gone now).
    for name in ("simpler", "simpler_2", "pypto_alone", "pypto_1"):
        layers = {"label": [f"{LABEL}.layer-commit={sha(name)}", f"{LABEL}.kind=layer"]}
        for image in docker_client.images.list(filters=layers):
            docker_client.images.remove(image.id, force=True)
    for image in docker_client.images.list(filters={"label": f"{LABEL}.test-run={RUN}"}):
        docker_client.images.remove(image.id, force=True)


def pair_image(
    client: docker.DockerClient,
    base: tuple[str, str],
    pypto: tuple[str, Path],
    simpler: tuple[str, Path],
    log_path: Path,
    **options: bool,
) -> TestImage:
    """The test image of this run's commits `pypto` and `simpler` (names given to `sha`) with
    these wheels, on `base` (the image's name and id)."""
    return ensure_test_image(
        client,
        base_image=base[0],
        base_image_id=base[1],
        pypto_sha=sha(pypto[0]),
        pypto_wheel=pypto[1],
        simpler_sha=sha(simpler[0]),
        simpler_wheel=simpler[1],
        log_path=log_path,
        **options,
    )


def run_in(client: docker.DockerClient, image: str, code: str, log_path: Path) -> str:
    result = run_container(
        client, ContainerSpec(image=image, command=["python3", "-c", code]), log_path=log_path
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.docker
def test_a_test_image_holds_both_wheels_and_says_so_in_its_labels(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    def ensure() -> TestImage:
        return pair_image(
            docker_client,
            (base_image, base_image_id),
            ("pypto_1", wheels.pypto_1),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    built = ensure()
    again = ensure()

    assert not built.reused and built.seconds > 0
    assert built.tag == image_tag(sha("pypto_1"), sha("simpler"), base_image_id)
    base = base_image_id.split(":")[-1][:12]
    assert built.tag == f"bisect-precision/pypto:{sha('pypto_1')[:12]}-{sha('simpler')[:12]}-{base}"
    image = docker_client.images.get(built.image_id)
    assert built.tag in image.tags
    labels = image.labels
    assert labels[LABEL] == "1"
    assert labels[f"{LABEL}.pypto"] == sha("pypto_1")
    assert labels[f"{LABEL}.simpler"] == sha("simpler")
    assert labels[f"{LABEL}.base-image"] == base_image_id
    assert labels[f"{LABEL}.recipe"] == recipe_digest()
    assert len(labels[f"{LABEL}.pypto-wheel"]) == 64
    assert len(labels[f"{LABEL}.simpler-wheel"]) == 64
    assert f"committed {built.tag}" in (tmp_path / "image.log").read_text()
    # The layering container's owner is not the image's: those labels are blanked.
    assert labels[f"{LABEL}.owner"] == labels[f"{LABEL}.run"] == ""
    assert labels[f"{LABEL}.kind"] == "test-image"
    base_config = docker_client.images.get(base_image_id).attrs["Config"]
    config = image.attrs["Config"]
    # The layering command replaced the entrypoint only while pip ran.
    assert (config["Entrypoint"] or None, config["Cmd"]) == (
        base_config["Entrypoint"] or None,
        base_config["Cmd"],
    )
    assert config["User"] == base_config["User"]

    assert again.reused and again.image_id == built.image_id and again.tag == built.tag
    output = run_in(
        docker_client,
        built.tag,
        "import pypto, simpler; print(pypto.REVISION, simpler.describe(), pypto.mean([1.0, 3.0]))",
        tmp_path / "run.log",
    )
    assert output.strip() == "1 simpler r1 2.0"


@pytest.mark.docker
@pytest.mark.parametrize(
    ("moving", "pypto_first", "code", "expected"),
    [
        # pypto commits that pin one simpler share its layer (simpler goes first)
        ("pypto", False, "import pypto; print(pypto.FACTOR)", "1.5"),
        # simpler commits under a pinned pypto share pypto's (a pypto no other test layers with
        # a simpler: an equal image would be reused as it is)
        (
            "simpler",
            True,
            "import pypto, simpler; print(pypto.REVISION, simpler.describe())",
            "0 simpler r2",
        ),
    ],
)
def test_two_images_share_the_layer_of_the_wheel_they_have_in_common(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
    moving: str,
    pypto_first: bool,
    code: str,
    expected: str,
) -> None:
    if moving == "pypto":
        pairs = [(("pypto_1", wheels.pypto_1), ("simpler", wheels.simpler))]
        pairs.append((("pypto_2", wheels.pypto_2), ("simpler", wheels.simpler)))
    else:
        pairs = [(("pypto_alone", wheels.pypto_alone), ("simpler", wheels.simpler))]
        pairs.append((("pypto_alone", wheels.pypto_alone), ("simpler_2", wheels.simpler_2)))
    images = [
        pair_image(
            docker_client,
            (base_image, base_image_id),
            pypto,
            simpler,
            tmp_path / f"{n}.log",
            pypto_first=pypto_first,
        )
        for n, (pypto, simpler) in enumerate(pairs)
    ]

    base_layers = docker_client.images.get(base_image_id).attrs["RootFS"]["Layers"]
    first, second = (docker_client.images.get(i.image_id).attrs["RootFS"]["Layers"] for i in images)
    shared = len(base_layers) + 1  # one layer per wheel
    assert len(first) == len(second) == shared + 1
    assert first[:shared] == second[:shared]
    assert first[shared:] != second[shared:]
    assert images[0].image_id != images[1].image_id
    shared_package = "simpler" if moving == "pypto" else "pypto"
    assert f"reusing layer {LAYER_REPOSITORY}:{shared_package}-" in (tmp_path / "1.log").read_text()
    assert run_in(docker_client, images[1].tag, code, tmp_path / "r").strip() == expected


@pytest.mark.docker
def test_a_pypto_from_before_the_runtime_submodule_gets_an_image_without_simpler(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    image = ensure_test_image(
        docker_client,
        base_image=base_image,
        base_image_id=base_image_id,
        pypto_sha=sha("pypto_alone"),
        pypto_wheel=wheels.pypto_alone,
        simpler_sha=None,
        simpler_wheel=None,
        log_path=tmp_path / "image.log",
    )

    assert image.tag.split(":")[1].split("-")[1] == "none"
    labels = docker_client.images.get(image.image_id).labels
    assert labels[f"{LABEL}.simpler"] == labels[f"{LABEL}.simpler-wheel"] == "none"
    code = "import importlib.util as u, pypto; print(pypto.mean([2.0]), u.find_spec('simpler'))"
    assert run_in(docker_client, image.tag, code, tmp_path / "run.log").strip() == "2.0 None"


@pytest.fixture(scope="module")
def entrypoint_base(docker_client: docker.DockerClient, base_image: str) -> str:
    """A CANN-like base: its ENTRYPOINT prepares the environment and then runs the command."""
    entry = b'#!/bin/sh\nexport BISECT_ENTRY="set_env.sh sourced"\nexec "$@"\n'
    return _build_base(
        docker_client,
        ENTRYPOINT_BASE,
        f"FROM {base_image}\n"
        "COPY entry.sh /entry.sh\n"
        "RUN chmod 755 /entry.sh\n"
        'ENTRYPOINT ["/entry.sh"]\n'
        "USER nobody\n",
        {"entry.sh": entry},
    )


@pytest.mark.docker
def test_an_image_is_found_by_its_tag_and_after_its_tag_moved_by_its_labels(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    def ensure(pypto_wheel: Path) -> TestImage:
        return pair_image(
            docker_client,
            (base_image, base_image_id),
            ("retagged", pypto_wheel),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    first = ensure(wheels.pypto_1)
    assert find_test_image(docker_client, {f"{LABEL}.pypto": sha("retagged")}, first.tag) == (
        first.image_id
    )
    # The same commits with a wheel built again (other contents): a new image takes the tag.
    rebuilt = ensure(wheels.pypto_2)
    assert not rebuilt.reused and rebuilt.image_id != first.image_id
    assert docker_client.images.get(first.tag).id == rebuilt.image_id
    # The first wheel again: its image is found by its labels and gets the tag back.
    again = ensure(wheels.pypto_1)
    assert again.reused and again.image_id == first.image_id
    assert docker_client.images.get(first.tag).id == first.image_id
    # No image under the tag: nothing is listed, since an equal image would carry it.
    assert find_test_image(docker_client, {LABEL: "1"}, f"{first.tag}-none") is None
    assert find_test_image(docker_client, {f"{LABEL}.pypto": sha("retagged")}) is not None


@pytest.mark.docker
def test_the_base_images_entrypoint_still_wraps_the_command(
    docker_client: docker.DockerClient,
    entrypoint_base: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    image = pair_image(
        docker_client,
        (ENTRYPOINT_BASE, entrypoint_base),
        ("pypto_1", wheels.pypto_1),
        ("simpler", wheels.simpler),
        tmp_path / "image.log",
    )

    config = docker_client.images.get(image.image_id).attrs["Config"]
    assert config["Entrypoint"] == ["/entry.sh"]
    assert config["User"] == "nobody", "the base image's user must be restored after pip"
    code = (
        "import os, getpass, pypto, simpler; print(os.environ['BISECT_ENTRY'], getpass.getuser())"
    )
    output = run_in(docker_client, image.tag, code, tmp_path / "run.log")
    assert output.strip() == "set_env.sh sourced nobody"


@pytest.mark.docker
@pytest.mark.parametrize("other", ["requires-python", "tag"])
def test_a_wheel_for_another_python_is_refused_as_pip_refuses_it(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
    other: str,
) -> None:
    """The layer installer leaves these to pip: the commit is untestable, as before."""
    import zipfile

    name = wheels.pypto_1.name
    tag = name.removesuffix(".whl").split("-", 2)[2]
    if other == "tag":
        name = name.replace(tag, "cp27-cp27mu-linux_x86_64")
    rewritten = tmp_path / name
    with zipfile.ZipFile(wheels.pypto_1) as source, zipfile.ZipFile(rewritten, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if other == "requires-python" and item.filename.endswith(".dist-info/METADATA"):
                data = data.replace(b"\nName:", b"\nRequires-Python: >=99\nName:", 1)
            if other == "tag" and item.filename.endswith(".dist-info/WHEEL"):
                data = data.replace(f"Tag: {tag}".encode(), b"Tag: cp27-cp27mu-linux_x86_64")
            target.writestr(item, data)

    with pytest.raises(WheelInstallFailed, match="wheel itself is broken") as raised:
        pair_image(
            docker_client,
            (base_image, base_image_id),
            ("broken", rewritten),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    assert raised.value.package == "pypto"
    log = (tmp_path / "image-pypto.log").read_text()
    handed = {
        "requires-python": "Requires-Python excludes this Python",
        "tag": "no tag of the wheel is this interpreter's",
    }[other]
    refused = {
        "requires-python": "requires a different Python",
        "tag": "is not a supported wheel on this platform",
    }[other]
    assert handed in log and refused in log, log


@pytest.mark.docker
def test_a_wheel_pip_cannot_install_is_blamed_on_the_wheel_not_the_engine(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    broken = tmp_path / wheels.pypto_1.name
    broken.write_bytes(wheels.pypto_1.read_bytes()[:200])

    with pytest.raises(WheelInstallFailed, match="wheel itself is broken") as raised:
        pair_image(
            docker_client,
            (base_image, base_image_id),
            ("broken", broken),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    assert (raised.value.package, raised.value.commit) == ("pypto", sha("broken"))
    assert docker_client.images.list(filters={"label": f"{LABEL}.pypto={sha('broken')}"}) == []
    assert "pip install" in (tmp_path / "image.log").read_text()
    assert "pypto" in (tmp_path / "image-pypto.log").read_text()
    mine = f"{OWNER_LABEL}={socket.gethostname()}:{os.getpid()}"  # other runs may share the engine
    kinds = {
        c.labels.get(f"{LABEL}.kind")
        for c in docker_client.containers.list(
            all=True, filters={"label": mine}, ignore_removed=True
        )
    }
    assert "layer" not in kinds, "the failed layering container is removed"


@pytest.mark.docker
def test_images_are_made_in_parallel_and_share_one_layer(
    docker_client: docker.DockerClient,
    base_image: str,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
) -> None:
    """Three threads at once, two of them wanting the same image: each image is made once,
    all on one simpler layer, and each holds what it should."""
    pairs = [("pypto_1", wheels.pypto_1), ("pypto_2", wheels.pypto_2), ("pypto_2", wheels.pypto_2)]
    barrier = threading.Barrier(len(pairs))

    def make(n: int) -> TestImage:
        name, wheel = pairs[n]
        barrier.wait()
        return pair_image(
            docker_client,
            (base_image, base_image_id),
            (f"parallel-{name}", wheel),
            ("simpler_2", wheels.simpler_2),
            tmp_path / f"{n}.log",
            speculative=n == 2,
        )

    with ThreadPoolExecutor(len(pairs)) as pool:
        images = list(pool.map(make, range(len(pairs))))

    assert images[1].image_id == images[2].image_id
    assert sum(not image.reused for image in images) == 2
    layers = [docker_client.images.get(i.image_id).attrs["RootFS"]["Layers"] for i in images]
    assert layers[0][:-1] == layers[1][:-1] and layers[0][-1] != layers[1][-1]
    code = "import pypto, simpler; print(pypto.FACTOR, simpler.describe())"
    outputs = [run_in(docker_client, i.tag, code, tmp_path / f"r{n}") for n, i in enumerate(images)]
    assert [o.strip() for o in outputs] == ["1.0 simpler r2", "1.5 simpler r2", "1.5 simpler r2"]


def test_a_failed_image_build_is_summed_up_by_its_error_not_dockers_epilogue():
    output = [
        "Step 3/4 : RUN python3 -m pip install --no-index /wheels/*.whl",
        " ---> Running in 0123456789ab",
        "Processing /wheels/cmake-3.31.6-py3-none-any.whl",
        "ERROR: pip is disabled in this image: use the distribution's packages",
        "",
        "The command '/bin/sh -c python3 -m pip install' returned a non-zero code: 1",
    ]
    assert _cause(output) == "ERROR: pip is disabled in this image: use the distribution's packages"
    assert _cause(["Step 1/2 : FROM base", "exec format error"]) == "exec format error"
    assert _cause(["Step 1/2 : FROM base", "killed"]) == "killed"
    assert _cause([]) == "no output"
    # As the stream gives Docker's epilogue: an error chunk, written with "ERROR: " in front.
    # The one line said "ERROR: The command '...python3 /tmp/bisect-build-wheels/pip-25..." cut
    # short, and the cause was only in the log.
    streamed = [
        "Step 4/5 : RUN python3 /tmp/bisect-build-wheels/pip-25.3-py3-none-any.whl/pip install",
        " ---> Running in 0123456789ab",
        "Traceback (most recent call last):",
        "ModuleNotFoundError: No module named 'distutils.cmd'",
        "\x1b[91mERROR: The command '/bin/sh -c pip install' returned a non-zero code: 1",
    ]
    assert _cause(streamed) == "ModuleNotFoundError: No module named 'distutils.cmd'"
    coloured = ["\x1b[91mERROR: Could not find an activated virtualenv (required).\x1b[0m"]
    assert _cause(coloured) == "ERROR: Could not find an activated virtualenv (required)."


# What the layering container runs, file for file against pip: a console script (wheel), a
# .data/scripts binary (ninja), a large pure package with a .pth file (setuptools).
_COMPARE = r"""
set -e
snapshot() {
    find /usr/local -newer /tmp/stamp -type f ! -name RECORD ! -name INSTALLER \
        ! -name direct_url.json ! -name REQUESTED ! -name "*.pyc" -print0 \
        | sort -z | xargs -0 md5sum
    # a .pyc holds the time its source was written: compared by name
    find /usr/local -newer /tmp/stamp -type f -name "*.pyc" | sort
    find /usr/local -newer /tmp/stamp -type f -perm -u+x | sort
}
name=$(basename "$1" | cut -d- -f1)
touch /tmp/stamp; sleep 1
python3 -m pip install -q --no-index --no-deps --no-cache-dir "$1"
snapshot > /tmp/pip
python3 -m pip uninstall -y -q "$name"
touch /tmp/stamp; sleep 1
sh -c "$INSTALL_COMMAND" > /tmp/out
grep -q "^installed $name " /tmp/out || { cat /tmp/out; exit 9; }
snapshot > /tmp/ours
cmp /tmp/pip /tmp/ours || { diff /tmp/pip /tmp/ours; exit 8; }
python3 -m pip show -f "$name" > /dev/null
echo "same $name $(wc -l < /tmp/ours)"
sh -c "$INSTALL_COMMAND"  # installed already: handed to pip, which replaces it
"""


@pytest.mark.docker
@pytest.mark.parametrize("name", ["wheel", "ninja", "setuptools"])
def test_the_layer_installer_puts_every_file_where_pip_does_and_hands_the_rest_to_pip(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path, name
) -> None:
    from runner.images import _PIP_ENVIRONMENT
    from runner.install import install_command

    wheel = f"/wheels/{next(wheelhouse.glob(f'{name}-*.whl')).name}"
    result = run_container(
        docker_client,
        ContainerSpec(
            image=base_image,
            command=["sh", "-c", _COMPARE, "compare", wheel],
            environment={
                **_PIP_ENVIRONMENT,
                "INSTALL_COMMAND": install_command("python3 -m pip", wheel),
            },
            mounts=[Mount(str(wheelhouse), "/wheels")],
        ),
        log_path=tmp_path / "compare.log",
        timeout=300,
    )

    assert result.exit_code == 0, result.output
    [counted] = [line.split()[2] for line in result.output.splitlines() if line.startswith("same ")]
    assert int(counted) > 3, "files, scripts and .pyc files are compared"
    assert f"{name} is installed already: pip replaces it" in result.output


def _build_base(
    client: docker.DockerClient, tag: str, dockerfile: str, files: dict[str, bytes]
) -> str:
    """A base image of this test run (removed with the run's images)."""
    return build_from_text(
        client, dockerfile, files, tag=tag, labels={LABEL: "1", f"{LABEL}.test-run": RUN}
    )


@pytest.fixture(scope="module")
def venv_base(docker_client: docker.DockerClient, base_image_id: str, wheels: Wheels) -> str:
    """A CANN-like base: its entrypoint puts its own Python (a venv in /opt/py) first on PATH,
    and that Python has simpler installed already, at the tested wheel's version but with
    other contents (a dev image with an older build of it)."""
    entry = b'#!/bin/sh\nexport PATH=/opt/py/bin:$PATH\nexec "$@"\n'
    return _build_base(
        docker_client,
        VENV_BASE,
        f"FROM {base_image_id}\n"
        "COPY entry.sh /entry.sh\n"
        f"COPY {wheels.simpler.name} /tmp/\n"
        "RUN chmod 755 /entry.sh && python3 -m venv /opt/py"
        f" && /opt/py/bin/pip install -q --no-index /tmp/{wheels.simpler.name}"
        " && sed -i 's/^REVISION = 1$/REVISION = 99/' /opt/py/lib/python3*/site-packages/simpler/"
        "__init__.py && rm /tmp/*.whl\n"
        'ENTRYPOINT ["/entry.sh"]\n',
        {"entry.sh": entry, wheels.simpler.name: wheels.simpler.read_bytes()},
    )


@pytest.mark.docker
def test_wheels_go_into_the_python_the_entrypoint_runs_over_what_it_has_installed(
    docker_client: docker.DockerClient, venv_base: str, wheels: Wheels, tmp_path: Path
) -> None:
    """Layering went around the entrypoint, into the system python3, and pip left an installed
    distribution of the same version as it was: the example then ran the image's copy of
    simpler, whatever the commit, and a wrong culprit came out with exit 0."""
    image = pair_image(
        docker_client,
        (VENV_BASE, venv_base),
        ("pypto_1", wheels.pypto_1),
        ("simpler", wheels.simpler),
        tmp_path / "image.log",
    )

    code = "import simpler, pypto; print(simpler.REVISION, simpler.__file__, pypto.__file__)"
    revision, simpler_file, pypto_file = run_in(
        docker_client, image.tag, code, tmp_path / "run.log"
    ).split()
    assert revision == "1", "the image's own build of simpler was kept"
    assert simpler_file.startswith("/opt/py/") and pypto_file.startswith("/opt/py/")


@pytest.mark.docker
def test_a_base_image_with_its_own_copy_on_its_path_is_refused(
    docker_client: docker.DockerClient, base_image_id: str, wheels: Wheels, tmp_path: Path
) -> None:
    """A copy on the image's PYTHONPATH comes before any site directory: every test would run
    it. That stops the run, naming the copy, rather than giving the same verdict for all."""
    tag = f"bisect-precision-test/shadow-base:{RUN}"
    shadow = _build_base(
        docker_client,
        tag,
        f"FROM {base_image_id}\nCOPY pypto.py /opt/shadow/pypto/__init__.py\n"
        "ENV PYTHONPATH=/opt/shadow\n",
        {"pypto.py": b"FACTOR = 1.0\n"},
    )

    with pytest.raises(BadInput) as raised:
        pair_image(
            docker_client,
            (tag, shadow),
            ("pypto_2", wheels.pypto_2),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    said = str(raised.value)
    assert "has its own pypto at /opt/shadow/pypto/__init__.py" in said, said
    assert "\n" not in said


# Debian bullseye's Python 3.9 and Ubuntu 20.04's 3.8 on the base's Python: their sysconfig is
# unpatched, so its default scheme puts libraries in /usr/lib/python3.X/site-packages, on no
# path, while their pip uses distutils, which Debian did patch (/usr/local/lib/python3.X/
# dist-packages).
_BULLSEYE_SYSCONFIG = b"""\
import sysconfig

sysconfig.get_paths.__defaults__ = ("posix_prefix", None, True)
sysconfig.get_path.__defaults__ = ("posix_prefix", None, True)
sysconfig._PIP_USE_SYSCONFIG = False
"""

# An import hook of the image that hides the tested packages wherever they are installed.
_HIDING_HOOK = b"""\
import sys


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name in ("pypto", "simpler"):
            raise ModuleNotFoundError(name)


sys.meta_path.insert(0, Hide())
"""


def _base_with_sitecustomize(
    client: docker.DockerClient, base_image_id: str, name: str, sitecustomize: bytes, more: str
) -> tuple[str, str]:
    """A base of this test run whose Python runs `sitecustomize` at start-up; its tag and id."""
    tag = f"bisect-precision-test/{name}-base:{RUN}"
    dockerfile = (
        f"FROM {base_image_id}\nCOPY sitecustomize.py /tmp/\n"
        'RUN python3 -c "import shutil, sysconfig;'
        " shutil.copy('/tmp/sitecustomize.py', sysconfig.get_path('stdlib'))\""
        f" && rm /tmp/sitecustomize.py\n{more}"
    )
    return tag, _build_base(client, tag, dockerfile, {"sitecustomize.py": sitecustomize})


@pytest.mark.docker
def test_wheels_go_where_pip_puts_them_when_sysconfig_points_off_the_path(
    docker_client: docker.DockerClient, base_image_id: str, wheels: Wheels, tmp_path: Path
) -> None:
    """A new user's run on Debian bullseye: the layer installer wrote the wheels into
    sysconfig's /usr/lib/python3.9/site-packages, which python3 never looks in, and the run
    stopped at the first image ("cannot import pypto"). Pip, which installs them into
    /usr/local/lib/python3.9/dist-packages there, installs them now, whatever the image's
    pip.conf says: everything pip needs is on its command line."""
    pip_conf = (
        "[global]\\nrequire-virtualenv = true\\n"
        "[install]\\nuser = true\\nprefix = /opt/elsewhere\\n"
    )
    base = _base_with_sitecustomize(
        docker_client,
        base_image_id,
        "bullseye-like",
        _BULLSEYE_SYSCONFIG,
        f"RUN printf '{pip_conf}' > /etc/pip.conf\n",
    )

    image = pair_image(
        docker_client,
        base,
        ("pypto_1", wheels.pypto_1),
        ("simpler", wheels.simpler),
        tmp_path / "image.log",
    )

    code = "import simpler, pypto; print(simpler.__file__, pypto.__file__)"
    found = run_in(docker_client, image.tag, code, tmp_path / "run.log").split()
    assert [f.split("/")[:4] for f in found] == [["", "usr", "local", "lib"]] * 2, found
    for package in ("pypto", "simpler"):
        log = (tmp_path / f"image-{package}.log").read_text()
        assert "site-packages is not on sys.path" in log, log


@pytest.mark.docker
@pytest.mark.parametrize(
    ("name", "sitecustomize", "more", "said"),
    [
        (
            "pip-elsewhere",
            _BULLSEYE_SYSCONFIG,
            "ENV PIP_PREFIX=/opt/elsewhere\n",  # (a pip.conf saying so is ignored)
            "pip put the wheel where that interpreter does not look; make pip there install "
            "into a directory on `python3`'s sys.path",
        ),
        (
            "hiding-hook",
            _HIDING_HOOK,
            "",
            "dist-packages, which it imports from, so something the image sets up (an import "
            "hook, a .pth file) hides it there",
        ),
    ],
    ids=["pip-elsewhere", "hiding-hook"],
)
def test_a_wheel_its_python_cannot_import_stops_the_run_saying_who_put_it_where(
    docker_client: docker.DockerClient,
    base_image_id: str,
    wheels: Wheels,
    tmp_path: Path,
    name: str,
    sitecustomize: bytes,
    more: str,
    said: str,
) -> None:
    """The message told the user to give --python the entrypoint's interpreter, which it was
    already: the layer installer or that interpreter's own pip installs the wheel, and that
    interpreter looks for it."""
    base = _base_with_sitecustomize(docker_client, base_image_id, name, sitecustomize, more)

    with pytest.raises(BadInput) as raised:
        pair_image(
            docker_client,
            base,
            ("pypto_1", wheels.pypto_1),
            ("simpler", wheels.simpler),
            tmp_path / "image.log",
        )

    message = str(raised.value)
    assert "`python3` there cannot import simpler: " in message, message
    assert said in message and "--python" not in message, message


def test_listing_images_goes_on_when_one_is_removed_while_it_is_listed() -> None:
    """`images.list` inspects each image it lists; a cleanup or prune elsewhere that removes one
    in between failed the listing, and with it a test's image lookup or `cleanup`."""
    from types import SimpleNamespace

    from runner.images import list_images

    calls: list[dict] = []

    def listing(filters: dict) -> list[str]:
        calls.append(filters)
        if len(calls) == 1:
            raise docker.errors.ImageNotFound("no such image: sha256:gone")
        return ["image"]

    client = SimpleNamespace(images=SimpleNamespace(list=listing))
    assert list_images(client, {"label": "x=1"}) == ["image"]  # type: ignore[arg-type]
    assert calls == [{"label": "x=1"}, {"label": "x=1"}]


@pytest.mark.docker
def test_an_image_the_tool_builds_has_no_network_in_its_steps(docker_client, base_image, tmp_path):
    """Builder images install their tools from the build context: a step that reached the
    network would make the image depend on the day it was built, as no build container may."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        'RUN test "$(ls /sys/class/net)" = lo || { ls /sys/class/net; exit 1; }\n'
        f"LABEL {LABEL}=1\n"
    )
    tag = f"bisect-precision-test-offline:{secrets.token_hex(4)}"
    try:
        image_id = build_image(
            docker_client, tmp_path, tag=tag, log_path=tmp_path / "build.log", what="an image"
        )
        assert docker_client.images.get(tag).id == image_id
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_a_stopping_run_cuts_an_image_build_under_way(docker_client, base_image, tmp_path):
    """Ctrl-C while a builder image is being built: the build ends in the engine at once (its
    step's container goes, and the steps it made), instead of the process waiting for it."""
    token = secrets.token_hex(6)
    label = f"bisect-precision-test-cut={token}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\nLABEL {label}\nRUN sleep 300 # {token}\n"
    )
    log = tmp_path / "build.log"
    cutter = BuildCutter()
    outcome: list[object] = []

    def build() -> None:
        try:
            outcome.append(
                build_image(
                    docker_client, tmp_path, tag=f"x:{token}", log_path=log, what="x", cutter=cutter
                )
            )
        except Exception as exc:
            outcome.append(exc)

    def sleeping() -> list[object]:
        return [
            c
            for c in docker_client.containers.list(all=True)
            if token in " ".join(c.attrs["Config"].get("Cmd") or [])
        ]

    thread = threading.Thread(target=build)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not sleeping() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sleeping(), log.read_text() if log.exists() else "the build started no step"
        stopped = time.monotonic()
        cutter.stop()
        thread.join(30)
        assert time.monotonic() - stopped < 15
        assert len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome
        assert "stopped: the run is stopping" in log.read_text()
        while sleeping() and time.monotonic() < stopped + 20:  # the engine's kill and removal
            time.sleep(0.2)
        assert not sleeping()
        assert not docker_client.images.list(filters={"label": label})  # the LABEL step's image
        with pytest.raises(Cancelled):  # a build asked for after the stop is not started
            build_image(docker_client, tmp_path, tag="x:y", log_path=log, what="x", cutter=cutter)
    finally:
        cutter.stop()
        thread.join(30)
        for image in docker_client.images.list(filters={"label": label}):
            with contextlib.suppress(docker.errors.APIError):
                docker_client.images.remove(image.id, force=True)
