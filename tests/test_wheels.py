"""Wheels are built in containers once per (commit, environment) and then come from the cache."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from runner.config import PEP517_FRONTEND_PATH
from runner.errors import InfrastructureError
from runner.execute import LABEL
from runner.sample.packages import write_pypto, write_simpler
from runner.sources import ExportResult
from runner.wheels import (
    BuildSettings,
    WheelCache,
    WheelResult,
    build_wheel,
    builder_spec,
    last_error_line,
    ran_out_of_space,
)
from tests.fixtures.cli import cli


class Sources:
    """A `prepare_source` that records every export, as the session's lazy exporter would."""

    def __init__(self, write: Callable[[Path], None]) -> None:
        self.write = write
        self.exports: list[Path] = []
        self.lock = threading.Lock()

    def __call__(self, dest: Path) -> None:
        with self.lock:
            self.exports.append(dest)
        self.write(dest)


class DatedSources(Sources):
    """Returns what the exporter returns: the export, with the commit's time."""

    def __init__(self, write: Callable[[Path], None], committed: int) -> None:
        super().__init__(write)
        self.committed = committed

    def __call__(self, dest: Path) -> ExportResult:  # type: ignore[override]
        super().__call__(dest)
        return ExportResult("a" * 40, dest, {}, 0.0, self.committed)


def simpler_source(revision: int = 1) -> Sources:
    return Sources(lambda dest: write_simpler(dest, revision=revision))


def pypto_source(revision: int) -> Sources:
    return Sources(lambda dest: write_pypto(dest, revision=revision))


def failing_source(message: str) -> Sources:
    """A package whose build stops the way a missing native header stops pypto's CMake."""

    def write(dest: Path) -> None:
        (dest / "setup.py").write_text(f"raise SystemExit({message!r})\n")

    return Sources(write)


def network_probe_source() -> Sources:
    """A package that records, at build time, which network interfaces the builder could see."""

    def write(dest: Path) -> None:
        (dest / "setup.py").write_text(
            textwrap.dedent(
                """
                from pathlib import Path
                from setuptools import setup

                lines = Path("/proc/net/dev").read_text().splitlines()[2:]
                names = sorted(line.split(":")[0].strip() for line in lines)
                Path("netprobe").mkdir(exist_ok=True)
                Path("netprobe/__init__.py").write_text(f"INTERFACES = {names!r}\\n")
                setup(name="netprobe", version="1.0", packages=["netprobe"])
                """
            )
        )

    return Sources(write)


@pytest.fixture(scope="module")
def settings(base_image: str, setuptools_builder: str) -> BuildSettings:
    """Builds run in a builder image: the base image alone has no build backend."""
    return BuildSettings(base_image=base_image, base_image_id=setuptools_builder, timeout=120)


@pytest.fixture
def cache(tmp_path: Path) -> WheelCache:
    return WheelCache(tmp_path / "cache" / "wheels")


@pytest.fixture
def ccache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "ccache"


def builder_containers_created(client: docker.DockerClient, key: str, since: float) -> int:
    """How many builder containers the engine created for this cache key since `since`."""
    events = client.events(
        since=int(since),
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": f"{LABEL}.key={key}"},
        decode=True,
    )
    return sum(1 for _ in events)


def assert_no_leftover_build_dirs(cache: WheelCache) -> None:
    leftovers = list(cache.tmp_dir.iterdir()) if cache.tmp_dir.exists() else []
    assert leftovers == [], f"temporary build directories left behind: {leftovers}"


@pytest.mark.docker
def test_a_wheel_is_built_once_and_then_comes_from_the_cache(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    source = simpler_source()
    started = time.time()

    built = build_wheel(
        docker_client, cache, "simpler", "a" * 40, source, settings, ccache_dir=ccache_dir
    )
    again = build_wheel(
        docker_client, cache, "simpler", "a" * 40, source, settings, ccache_dir=ccache_dir
    )

    assert built.ok and not built.from_cache and built.seconds > 0, built.reason
    assert built.wheel is not None and built.wheel.name == "simpler-0.1.0-py3-none-any.whl"
    assert built.wheel.is_relative_to(cache.root)
    assert "Successfully built simpler" in built.log_path.read_text()
    assert again == replace(built, seconds=0.0, from_cache=True, export_s=0.0)
    assert len(source.exports) == 1, "the sources must only be exported on a miss"
    assert builder_containers_created(docker_client, built.key, started) == 1
    assert_no_leftover_build_dirs(cache)
    with zipfile.ZipFile(built.wheel) as wheel:
        assert "REVISION = 1" in wheel.read("simpler/__init__.py").decode()


@pytest.mark.docker
def test_a_cached_wheel_damaged_on_disk_is_never_used_and_is_built_again(
    docker_client: docker.DockerClient, cache: WheelCache, settings: BuildSettings, tmp_path: Path
) -> None:
    # Dated, as the exporter's sources are: the rebuild is then the same file, byte for byte.
    source = DatedSources(lambda dest: write_simpler(dest, revision=1), committed=1_700_000_000)

    def build() -> WheelResult:
        return build_wheel(
            docker_client, cache, "simpler", "d" * 40, source, settings, ccache_dir=tmp_path
        )

    built = build()
    assert built.ok and built.wheel is not None, built.reason
    data = built.wheel.read_bytes()
    with zipfile.ZipFile(built.wheel) as wheel:
        assert {entry.date_time[0] for entry in wheel.infolist()} == {2023}

    # Truncated: its size says so at once, and the next build makes it again.
    built.wheel.write_bytes(data[:600])
    assert cache.lookup("simpler", "d" * 40, settings) is None
    again = build()
    assert again.ok and not again.from_cache and again.wheel.read_bytes() == data

    # The same size, other bytes: only its digest tells, read when it fails to install.
    again.wheel.write_bytes(bytes(len(data)))
    hit = cache.lookup("simpler", "d" * 40, settings)
    assert hit is not None and cache.discard_if_damaged(hit)
    assert cache.lookup("simpler", "d" * 40, settings) is None
    intact = build()
    assert not cache.discard_if_damaged(intact) and intact.wheel.is_file()


@pytest.mark.docker
def test_pypto_commits_pinning_the_same_simpler_build_simpler_once(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    simpler = simpler_source()
    results: list[WheelResult] = []
    for revision, pypto_commit in ((1, "1" * 40), (2, "2" * 40)):
        for package, commit, source in (
            ("simpler", "5" * 40, simpler),
            ("pypto", pypto_commit, pypto_source(revision)),
        ):
            results.append(
                build_wheel(
                    docker_client, cache, package, commit, source, settings, ccache_dir=ccache_dir
                )
            )

    assert all(r.ok for r in results), [r.reason for r in results]
    built = [(r.package, r.from_cache) for r in results]
    assert built == [("simpler", False), ("pypto", False), ("simpler", True), ("pypto", False)]
    assert len(simpler.exports) == 1
    assert sorted(e.package for e in cache.entries()) == ["pypto", "pypto", "simpler"]


@pytest.mark.docker
def test_a_failing_build_is_remembered_with_its_log_and_never_retried(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    source = failing_source("error: pto/pto_isa.hpp: No such file or directory")

    failed = build_wheel(
        docker_client, cache, "pypto", "b" * 40, source, settings, ccache_dir=ccache_dir
    )
    again = build_wheel(
        docker_client, cache, "pypto", "b" * 40, source, settings, ccache_dir=ccache_dir
    )

    assert not failed.ok and failed.wheel is None and not failed.from_cache
    assert failed.reason == (
        "build failed (exit 1): error: pto/pto_isa.hpp: No such file or directory"
    )
    assert "pto_isa.hpp" in failed.log_path.read_text()
    assert again.from_cache and not again.ok and again.reason == failed.reason
    assert again.log_path == failed.log_path
    assert len(source.exports) == 1
    [entry] = cache.entries()
    assert (entry.package, entry.commit, entry.ok) == ("pypto", "b" * 40, False)

    pruned = cli("cache", "prune", "--failures", "--cache-dir", str(cache.root.parent))

    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 entry;" in pruned.stdout
    assert "keeps its skip verdicts: `run --new-session` builds those commits again" in (
        pruned.stdout.replace("\n", " ")
    )
    assert cache.entries() == []
    assert cache.lookup("pypto", "b" * 40, settings) is None


@pytest.mark.docker
def test_the_build_cannot_write_into_the_exported_sources(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    scribbler = replace(settings, command="touch /src/scribble")

    result = build_wheel(
        docker_client,
        cache,
        "simpler",
        "c" * 40,
        simpler_source(),
        scribbler,
        ccache_dir=ccache_dir,
    )

    assert not result.ok
    assert "Read-only file system" in result.reason


@pytest.mark.docker
def test_the_builder_has_no_network_unless_asked(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    def interfaces(result: WheelResult) -> list[str]:
        assert result.ok and result.wheel is not None, result.reason
        with zipfile.ZipFile(result.wheel) as wheel:
            text = wheel.read("netprobe/__init__.py").decode()
        return ast.literal_eval(text.split("=", 1)[1].strip())

    offline = build_wheel(
        docker_client,
        cache,
        "pypto",
        "d" * 40,
        network_probe_source(),
        settings,
        ccache_dir=ccache_dir,
    )
    online_settings = replace(settings, network=True)
    online = build_wheel(
        docker_client,
        cache,
        "pypto",
        "d" * 40,
        network_probe_source(),
        online_settings,
        ccache_dir=ccache_dir,
    )

    assert interfaces(offline) == ["lo"]
    assert set(interfaces(online)) - {"lo"}, "--build-network must give the builder a network"
    assert offline.key != online.key


@pytest.mark.docker
def test_a_timed_out_build_is_infrastructure_and_not_cached(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    slow = replace(settings, command="echo compiling; sleep 60", timeout=1.5)

    with pytest.raises(InfrastructureError) as raised:
        build_wheel(
            docker_client, cache, "pypto", "e" * 40, simpler_source(), slow, ccache_dir=ccache_dir
        )

    assert "not a verdict" in str(raised.value) and "timed out after 1.5s" in str(raised.value)
    kept = cache.failed_log_dir / f"{cache.key('pypto', 'e' * 40, slow)}.log"
    assert "compiling" in kept.read_text()
    assert cache.lookup("pypto", "e" * 40, slow) is None
    assert cache.entries() == []
    assert_no_leftover_build_dirs(cache)


@pytest.mark.docker
def test_an_engine_that_went_away_is_not_cached_as_a_build_failure(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
    tmp_path: Path,
) -> None:
    gone = docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41")

    with pytest.raises(InfrastructureError, match="Docker Engine"):
        build_wheel(
            gone, cache, "simpler", "f" * 40, simpler_source(), settings, ccache_dir=ccache_dir
        )

    assert cache.entries() == []
    assert_no_leftover_build_dirs(cache)
    retried = build_wheel(
        docker_client, cache, "simpler", "f" * 40, simpler_source(), settings, ccache_dir=ccache_dir
    )
    assert retried.ok and not retried.from_cache


@pytest.mark.docker
def test_two_runs_sharing_a_cache_build_a_wheel_once(
    docker_client: docker.DockerClient,
    settings: BuildSettings,
    ccache_dir: Path,
    tmp_path: Path,
) -> None:
    root = tmp_path / "shared" / "wheels"
    source = simpler_source()

    def one_run(_: int) -> WheelResult:
        # Each run has its own WheelCache, as two processes would.
        return build_wheel(
            docker_client,
            WheelCache(root),
            "simpler",
            "9" * 40,
            source,
            settings,
            ccache_dir=ccache_dir,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one_run, range(2)))

    assert sorted(r.from_cache for r in results) == [False, True]
    assert results[0].wheel == results[1].wheel
    assert len(source.exports) == 1


def build_simplers(
    client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
    commits: list[str],
) -> None:
    """One simpler wheel per commit into the cache, oldest first."""
    for commit in commits:
        result = build_wheel(
            client, cache, "simpler", commit, simpler_source(), settings, ccache_dir=ccache_dir
        )
        assert result.ok, result.reason


@pytest.mark.docker
def test_pruning_to_a_size_drops_the_least_recently_used_wheels_first(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    commits = ["1a" * 20, "2b" * 20, "3c" * 20]
    build_simplers(docker_client, cache, settings, ccache_dir, commits)
    assert cache.lookup("simpler", commits[0], settings) is not None  # the oldest, used again

    assert [e.commit for e in cache.entries()] == [commits[1], commits[2], commits[0]]
    removed = cache.prune(max_bytes=cache.size() - 1)

    assert [e.commit for e in removed] == [commits[1]]
    assert cache.lookup("simpler", commits[1], settings) is None
    assert cache.lookup("simpler", commits[0], settings) is not None
    assert {e.commit for e in cache.prune()} == {commits[0], commits[2]}
    assert cache.size() == 0


def test_the_reason_names_the_real_error_not_pips_epilogue() -> None:
    output = textwrap.dedent(
        """
        Building wheels for collected packages: pypto
          error: subprocess-exited-with-error
          CMake Error at CMakeLists.txt:12 (find_package): nanobind not found
          note: This error originates from a subprocess, and is likely not a problem with pip.
          ERROR: Failed building wheel for pypto
        ERROR: Failed to build pypto
        """
    )

    assert last_error_line(output) == (
        "CMake Error at CMakeLists.txt:12 (find_package): nanobind not found"
    )
    assert last_error_line("just one line\n") == "just one line"


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (
            """
            CMake Error at CMakeLists.txt:7:
              Parse error.  Function missing ending ")".  Instead found left paren
              with text "(".

            -- Configuring incomplete, errors occurred!
            *** CMake configuration failed
            """,
            'CMake Error at CMakeLists.txt:7: Parse error.  Function missing ending ")".  '
            'Instead found left paren with text "(".',
        ),
        (  # a setup.py that runs CMake: its traceback ends the log, the cause is far above
            """
            -- Found Python3: /usr/bin/python3 (found version "3.11.2")
            CMake Error at CMakeLists.txt:42 (find_package):
              Could not find a package configuration file provided by "pybind11" with any
              of the following names:

                pybind11Config.cmake

            -- Configuring incomplete, errors occurred!
            Traceback (most recent call last):
              File "/tmp/bisect-pep517.py", line 32, in <module>
                print("Successfully built " + backend.build_wheel(out), flush=True)
              File "/usr/lib/python3.11/subprocess.py", line 413, in check_call
                raise CalledProcessError(retcode, cmd)
            subprocess.CalledProcessError: Command '['cmake', '/tmp/bisect-build']' returned non-zero exit status 1.
            """,  # noqa: E501
            "CMake Error at CMakeLists.txt:42 (find_package): Could not find a package "
            'configuration file provided by "pybind11" with any of the following names:',
        ),
        (
            """
            CMake Error at CMakeLists.txt:3 (find_package):
              Could not find a package configuration file provided by "nanobind".
            -- Configuring incomplete, errors occurred!
            """,
            "CMake Error at CMakeLists.txt:3 (find_package): Could not find a package "
            'configuration file provided by "nanobind".',
        ),
    ],
)
def test_a_cmake_error_reads_with_its_location_and_message(output: str, reason: str) -> None:
    assert last_error_line(textwrap.dedent(output)) == reason


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (
            """
            csrc/core.c:2:79: error: expected expression before ')' token
                2 | static int scale(void) { return (); }
            csrc/core.c:9:1: error: 'scale' undeclared here
            error: command '/usr/bin/x86_64-linux-gnu-gcc' failed with exit code 1
            """,
            "csrc/core.c:2:79: error: expected expression before ')' token",
        ),
        (
            """
            /usr/bin/ld: CMakeFiles/core.dir/core.cpp.o: in function `run()':
            core.cpp:(.text+0x5): undefined reference to `missing_symbol()'
            collect2: error: ld returned 1 exit status
            ninja: build stopped: subcommand failed.
            """,
            "core.cpp:(.text+0x5): undefined reference to `missing_symbol()'",
        ),
    ],
    ids=["compile", "link"],
)
def test_a_failed_compile_or_link_reads_as_its_first_diagnostic(output: str, reason: str) -> None:
    assert last_error_line(textwrap.dedent(output)) == reason


def test_only_the_systems_words_for_a_full_disk_make_a_build_an_infrastructure_fault() -> None:
    assert ran_out_of_space("ld: final link failed: No space left on device\n")
    assert ran_out_of_space("OSError: [Errno 28] No space left on device: '/tmp/x'\n")
    assert ran_out_of_space("cp: error writing 'x': Disk quota exceeded\n")
    # A configure check and a line of code that name ENOSPC say nothing about the disk.
    assert not ran_out_of_space(
        "-- Looking for ENOSPC - found\n"
        "../src/core.cpp:3:32: error: expected primary-expression\n"
        "    3 |   if (e == ENOSPC) retrun -1; // No space left on device\n"
    )


def test_the_key_ignores_cpus_memory_and_timeout_but_not_the_environment() -> None:
    settings = BuildSettings(base_image="base:tag", base_image_id="sha256:" + "1" * 64)
    cache = WheelCache(Path("/nonexistent"))
    key = cache.key("pypto", "a" * 40, settings)

    assert cache.key("pypto", "a" * 40, replace(settings, cpus=2.0, memory="4g", timeout=5)) == key
    assert cache.key("pypto", "a" * 40, replace(settings, base_image="other:tag")) == key
    for changed in (
        replace(settings, environment={"PTO_ISA_ROOT": "/opt/pto-isa"}),
        replace(settings, base_image_id="sha256:" + "0" * 64),
        replace(settings, command=settings.command + " -v"),
        replace(settings, network=True),
    ):
        assert cache.key("pypto", "a" * 40, changed) != key
    assert cache.key("simpler", "a" * 40, settings) != key
    assert cache.key("pypto", "b" * 40, settings) != key


@pytest.mark.docker
def test_a_build_that_runs_out_of_disk_is_infrastructure_not_a_cached_failure(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    """ENOSPC says nothing about the commit: the next run must build it again."""
    full = replace(
        settings,
        command="echo 'ld: final link failed: No space left on device' >&2; exit 1",
    )

    with pytest.raises(InfrastructureError, match="ran out of disk space"):
        build_wheel(
            docker_client, cache, "pypto", "9" * 40, simpler_source(), full, ccache_dir=ccache_dir
        )

    assert cache.lookup("pypto", "9" * 40, full) is None
    assert cache.entries() == []
    assert_no_leftover_build_dirs(cache)


@pytest.mark.docker
def test_a_compiler_the_oom_killer_took_is_infrastructure_not_a_cached_failure(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    """The kernel killed cc1plus, not the container: ninja fails with exit 1, yet the commit
    compiles on a machine with the memory."""
    starved = replace(
        settings,
        command="echo 'c++: fatal error: Killed signal terminated program cc1plus' >&2; "
        "echo 'ninja: build stopped: subcommand failed.'; exit 1",
    )

    with pytest.raises(InfrastructureError, match="was killed"):
        build_wheel(
            docker_client,
            cache,
            "pypto",
            "8" * 40,
            simpler_source(),
            starved,
            ccache_dir=ccache_dir,
        )

    assert cache.lookup("pypto", "8" * 40, starved) is None
    assert cache.entries() == []


@pytest.mark.docker
def test_a_build_over_its_memory_limit_is_infrastructure_and_the_limit_is_named(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    hungry = replace(
        settings,
        command="python3 -c 'blocks = [bytearray(1 << 20) for _ in range(512)]'",
        memory="64m",
    )

    with pytest.raises(InfrastructureError, match="under its 64m limit \\(--memory\\)"):
        build_wheel(
            docker_client, cache, "pypto", "7" * 40, simpler_source(), hungry, ccache_dir=ccache_dir
        )

    assert cache.entries() == []


@pytest.mark.docker
def test_a_build_runs_as_the_caller_whatever_user_the_base_image_names(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
    tmp_path: Path,
) -> None:
    """A vendor image may end with `USER` a service account that cannot write /out."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {settings.base_image_id}\nRUN useradd -u 1234 service\nUSER service\n"
    )
    image, _ = docker_client.images.build(
        path=str(tmp_path), labels={"bisect-precision-docker": "1"}, rm=True
    )
    try:
        served = replace(settings, base_image_id=image.id)
        result = build_wheel(
            docker_client,
            cache,
            "simpler",
            "7" * 40,
            simpler_source(),
            served,
            ccache_dir=ccache_dir,
        )
        assert result.ok, result.reason
    finally:
        docker_client.images.remove(image.id, force=True)


@pytest.mark.docker
def test_a_compile_error_is_a_cached_build_failure_with_ccache_counts_absent(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
) -> None:
    broken = replace(settings, command="echo 'src/a.cpp:1:1: error: expected ;' >&2; exit 1")

    failed = build_wheel(
        docker_client, cache, "pypto", "8" * 40, simpler_source(), broken, ccache_dir=ccache_dir
    )

    assert not failed.ok and "error: expected ;" in failed.reason
    assert failed.ccache_hits is None
    assert cache.lookup("pypto", "8" * 40, broken) is not None


def test_a_killed_builds_staging_directory_is_swept_once_nobody_builds_its_key(
    cache: WheelCache,
) -> None:
    key = "ab" * 32
    cache.tmp_dir.mkdir(parents=True)
    staging = cache.tmp_dir / f"build-{key}-x1y2"  # what a SIGKILLed build leaves
    (staging / "src").mkdir(parents=True)
    (staging / "src" / "big.cpp").write_text("// a whole source export\n")
    trash = cache.tmp_dir / "trash-0123456789ab-z9"  # an entry removed half-way
    trash.mkdir()
    other = cache.tmp_dir / "unknown-recent"
    other.mkdir()

    with cache.locked(key):  # a build of that key runs now (here, or in another run)
        cache.sweep_leftovers()
        assert staging.is_dir()
    assert not trash.exists()

    cache.sweep_leftovers()
    assert not staging.exists()
    assert other.is_dir(), "a directory of unknown use is kept until it is a day old"


@pytest.mark.parametrize(
    ("committed", "epoch"), [(1_700_000_000, "1700000000"), (157_766_400, "315532800")]
)
def test_a_build_is_dated_by_its_commit_but_no_earlier_than_a_zip_can_hold(
    committed: int, epoch: str, tmp_path: Path
) -> None:
    """A commit dated 1975 (a rewritten date) failed to build with the wheel tools of its
    era: "ZIP does not support timestamps before 1980". It is dated 1980-01-01 instead."""
    spec = builder_spec(
        "simpler",
        "a" * 40,
        "k",
        BuildSettings(base_image="b", base_image_id="sha256:b"),
        src=tmp_path / "src",
        out=tmp_path / "out",
        ccache_dir=tmp_path / "ccache",
        source_date=committed,
    )
    assert spec.environment["SOURCE_DATE_EPOCH"] == epoch


@pytest.mark.docker
def test_a_wheel_rebuilt_from_the_same_commit_is_the_same_file_dated_by_the_commit(
    docker_client: docker.DockerClient, settings: BuildSettings, tmp_path: Path
) -> None:
    committed = 1_700_000_000  # 2023-11-14 22:13:20 UTC
    source = DatedSources(lambda dest: write_simpler(dest, revision=1), committed)
    built = [
        build_wheel(
            docker_client,
            WheelCache(tmp_path / name / "wheels"),
            "simpler",
            "a" * 40,
            source,
            settings,
            ccache_dir=tmp_path / name / "ccache",
        )
        for name in ("first", "second")
    ]
    # A user's SOURCE_DATE_EPOCH (--build-env) wins over the commit's.
    told = build_wheel(
        docker_client,
        WheelCache(tmp_path / "told" / "wheels"),
        "simpler",
        "a" * 40,
        source,
        replace(settings, environment={"SOURCE_DATE_EPOCH": "1600000000"}),
        ccache_dir=tmp_path / "told" / "ccache",
    )

    assert all(b.ok and not b.from_cache for b in [*built, told]), [b.reason for b in built]
    assert built[0].sha256 == built[1].sha256, "two builds of one commit made different wheels"
    assert built[0].wheel is not None and told.wheel is not None
    with zipfile.ZipFile(built[0].wheel) as wheel:
        assert {i.date_time for i in wheel.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    with zipfile.ZipFile(told.wheel) as wheel:
        assert {i.date_time for i in wheel.infolist()} == {(2020, 9, 13, 12, 26, 40)}


@pytest.mark.docker
def test_prune_keeps_the_wheels_a_running_session_uses_until_it_ends_or_dies(
    docker_client: docker.DockerClient, settings: BuildSettings, tmp_path: Path, ccache_dir: Path
) -> None:
    root = tmp_path / "cache" / "wheels"
    used, idle, other = "1a" * 20, "2b" * 20, "3c" * 20
    build_simplers(docker_client, WheelCache(root), settings, ccache_dir, [used, idle, other])
    session = WheelCache(root, lease=True)  # a run of this process
    assert session.lookup("simpler", used, settings) is not None
    # A run in another process, killed while it uses a wheel.
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from runner.wheels import BuildSettings, WheelCache
        settings = BuildSettings(base_image={settings.base_image!r},
                                 base_image_id={settings.base_image_id!r}, timeout=120)
        cache = WheelCache(Path({str(root)!r}), lease=True)
        assert cache.lookup("simpler", {other!r}, settings) is not None
        print("using", flush=True)
        sys.stdin.read()
        """
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "using"

        pruned = cli("cache", "prune", "--all", "--cache-dir", str(root.parent))

        assert pruned.returncode == 0, pruned.stderr
        assert "removed 1 entry;" in pruned.stdout
        assert "kept 2 entries" in pruned.stdout and "a running session uses" in pruned.stdout
        assert {e.commit for e in WheelCache(root).entries()} == {used, other}
    finally:
        killed.kill()
        killed.wait()
    assert [e.commit for e in WheelCache(root).prune()] == [other]  # its lease died with it
    session.release()
    assert [e.commit for e in WheelCache(root).prune()] == [used]
    assert list((root / ".leases").iterdir()) == []


def files_source(files: dict[str, str]) -> Callable[[], Sources]:
    """A project made of these files (path: text)."""

    def write(dest: Path) -> None:
        for name, text in files.items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_text(text)

    return lambda: Sources(write)


# A project whose backend lives in its own tree (`backend-path`), as some projects' do.
in_tree_backend_source = files_source(
    {
        "_build/backend.py": "from setuptools.build_meta import *  # noqa\n"
        "from setuptools import build_meta as _real\n"
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
        "    print('IN-TREE BACKEND')\n"
        "    return _real.build_wheel(wheel_directory, config_settings, metadata_directory)\n",
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "backend"\n'
        'backend-path = ["_build"]\n\n[project]\nname = "intree"\nversion = "2.0"\n',
        "intree/__init__.py": "",
    }
)
# No pyproject.toml at all: setuptools' legacy backend, as pip would pick.
setup_py_only_source = files_source(
    {
        "setup.py": "from setuptools import setup\n"
        "setup(name='legacy', version='3.0', packages=['legacy'])\n",
        "legacy/__init__.py": "",
    }
)


@pytest.mark.docker
@pytest.mark.parametrize(
    ("source", "wheel", "said"),
    [
        (in_tree_backend_source, "intree-2.0-py3-none-any.whl", "IN-TREE BACKEND"),
        (setup_py_only_source, "legacy-3.0-py3-none-any.whl", "Successfully built legacy"),
    ],
)
def test_the_default_build_calls_the_projects_own_pep517_backend(
    docker_client: docker.DockerClient,
    cache: WheelCache,
    settings: BuildSettings,
    ccache_dir: Path,
    source: Callable[[], Sources],
    wheel: str,
    said: str,
) -> None:
    built = build_wheel(
        docker_client, cache, "pypto", "d" * 40, source(), settings, ccache_dir=ccache_dir
    )

    assert built.ok, built.reason
    assert built.wheel is not None and built.wheel.name == wheel
    assert said in built.log_path.read_text()


@pytest.mark.docker
def test_the_build_frontend_falls_back_to_pip_where_nothing_reads_toml(
    docker_client: docker.DockerClient, cache: WheelCache, settings: BuildSettings, ccache_dir: Path
) -> None:
    """A Python before 3.11 without tomli (a setuptools-only builder) cannot read pyproject.toml;
    pip can. Importing pip's own reader instead would break setuptools' distutils shim."""
    no_toml = (
        "import sys; sys.modules['tomllib'] = sys.modules['tomli'] = None; "
        f"sys.argv = ['frontend', '/out']; exec(open('{PEP517_FRONTEND_PATH}').read())"
    )
    old_python = replace(settings, command=f'python3 -c "{no_toml}"')

    built = build_wheel(
        docker_client, cache, "pypto", "e" * 40, pypto_source(2), old_python, ccache_dir=ccache_dir
    )

    assert built.ok, built.reason
    assert built.wheel is not None and built.wheel.name == "pypto-0.2.0-py3-none-any.whl"
    assert "Successfully built pypto" in built.log_path.read_text()


@pytest.mark.docker
def test_a_build_that_needs_the_network_says_so_and_how_to_give_it_what_it_fetches(
    docker_client: docker.DockerClient, cache: WheelCache, settings: BuildSettings, ccache_dir: Path
) -> None:
    """As simpler's build does when it clones pto-isa without a local copy."""
    fetching = files_source(
        {
            "setup.py": "import urllib.request\n"
            "urllib.request.urlopen('https://github.com/hw-native-sys/pto-isa', timeout=10)\n"
        }
    )

    built = build_wheel(
        docker_client, cache, "simpler", "f" * 40, fetching(), settings, ccache_dir=ccache_dir
    )

    assert not built.ok
    assert "builds have none" in built.reason and "--pto-isa-root" in built.reason, built.reason


def test_a_wait_for_another_runs_lock_ends_when_the_run_stops(tmp_path: Path) -> None:
    """Another run's builder image or wheel may take minutes; a run stopped by Ctrl-C must not
    wait for it, since its process exits only once the waiting thread does."""
    from filelock import FileLock

    from runner.execute import Cancelled
    from runner.wheels import holding

    path = str(tmp_path / "key.lock")
    other, ours = FileLock(path), FileLock(path)
    held, release = threading.Event(), threading.Event()

    def another_run() -> None:
        with other:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=another_run)
    thread.start()
    try:
        assert held.wait(10)
        said: list[str] = []
        stop_at = time.monotonic() + 0.5
        started = time.monotonic()
        with (
            pytest.raises(Cancelled),
            holding(
                ours, "waiting for the other run", said.append, lambda: time.monotonic() > stop_at
            ),
        ):
            pytest.fail("the lock was taken while the other run held it")
        assert time.monotonic() - started < 5
        assert said == ["waiting for the other run"]
        assert not ours.is_locked
    finally:
        release.set()
        thread.join()
    with holding(ours, "not said", None, lambda: False):  # free again: taken at once
        assert ours.is_locked
