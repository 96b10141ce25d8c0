"""A user in the docker group (not root) runs, is cut off (SIGHUP), killed (SIGKILL) and resumes.

Containers run as root on their side; whatever they leave in the workdir or the cache must end up
owned by the user, or the user could neither resume nor clean up. The suite runs as root, so the
test makes a user of its own (CI included) and runs the real CLI as that user.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.execute import LABEL, OWNER_LABEL
from runner.sample.histories import SampleSpec
from tests.fixtures.cli import run_args
from tests.fixtures.samples import SMALL

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(1200)]

USER = "bisect-precision-tester"
SPEC = SampleSpec(**SMALL, bumps=((4, 5), (6, 6)), simpler_regression_at=3)


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("making a non-root test user needs root")
    try:
        docker_group = grp.getgrnam("docker")
    except KeyError:
        pytest.skip("no docker group on this machine: the engine socket is root's alone")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--groups", docker_group.gr_name, USER], check=True
        )
    return pwd.getpwnam(USER)


@pytest.fixture
def home(user: pwd.struct_passwd) -> Iterator[Path]:
    """A folder the user owns (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="bisect-nonroot-"))
    path.chmod(0o755)
    os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environment(user: pwd.struct_passwd) -> dict[str, str]:
    """This checkout and its installed packages, importable by a user who cannot read /root."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    return {
        "HOME": user.pw_dir,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *site]),
        "COLUMNS": "200",
        "LANG": "C.UTF-8",
    }


@pytest.fixture(scope="module")
def python(user: pwd.struct_passwd) -> str:
    """An interpreter of the same version the user may execute (a pyenv under /root is not)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        try:
            probe = subprocess.run(
                [candidate, "-c", "import runner.cli"],
                user=user.pw_uid,
                group=user.pw_gid,
                env=_environment(user),
                cwd="/",
                capture_output=True,
                check=False,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip(f"no {version} that the test user may run")


def _as_user(user: pwd.struct_passwd, python: str, args: list[str]) -> subprocess.Popen[str]:
    env = _environment(user)
    for name in ("DOCKER_HOST", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return subprocess.Popen(
        [python, "-m", "runner.cli", *args],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[grp.getgrnam("docker").gr_gid],
        env=env,
        cwd=user.pw_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _attempts(workdir: Path) -> list[dict]:
    try:
        return json.loads((workdir / "ledger.json").read_text())["attempts"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return []


def _wait_for(process: subprocess.Popen[str], workdir: Path, count: int) -> None:
    deadline = time.monotonic() + 600
    while len(_attempts(workdir)) < count and time.monotonic() < deadline:
        assert process.poll() is None, f"the run ended early: {process.communicate()[1]}"
        time.sleep(0.2)
    time.sleep(1.0)  # inside the next attempt: a build or a run is going on


def test_a_docker_group_user_is_cut_off_killed_and_resumes_owning_every_file(
    sample_factory, user, python, home, docker_client
) -> None:
    sample = sample_factory(SPEC)
    repos = home / "repos"
    shutil.copytree(sample.root, repos, symlinks=True)
    for path in [repos, *repos.rglob("*")]:
        os.lchown(path, user.pw_uid, user.pw_gid)
    copied = dataclasses.replace(sample, pypto=repos / "pypto", lib=repos / "pypto-lib")
    workdir, cache = home / "work", home / "cache"
    args = [*run_args(copied, workdir, cache), "--json"]

    cut_off = _as_user(user, python, args)
    _wait_for(cut_off, workdir, 1)
    cut_off.send_signal(signal.SIGHUP)
    _, stderr = cut_off.communicate(timeout=120)
    assert cut_off.returncode == 130, stderr
    assert "Traceback" not in stderr

    killed = _as_user(user, python, args)
    _wait_for(killed, workdir, len(_attempts(workdir)) + 1)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)

    resumed = _as_user(user, python, args)
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr
    assert json.loads(stdout)["simpler"]["first_bad"] == sample.simpler_shas[3]

    foreign = [
        str(path)
        for top in (workdir, cache)
        for path in [top, *top.rglob("*")]
        if path.lstat().st_uid != user.pw_uid
    ]
    assert foreign == [], f"files the user does not own: {foreign[:5]}"
    # This test's runs only: other users of the engine may be running examples meanwhile.
    owners = {f"{socket.gethostname()}:{run.pid}" for run in (cut_off, killed, resumed)}
    running = docker_client.containers.list(filters={"label": f"{LABEL}=1"}, ignore_removed=True)
    assert [
        c.name
        for c in running
        if c.labels.get(f"{LABEL}.kind") == "example" and c.labels.get(OWNER_LABEL) in owners
    ] == []
