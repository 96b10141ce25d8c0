"""A recorded verdict leaves the machine: `export` writes a bundle, and the bundle alone (Docker,
a shell, no tool, no repositories, not even the image in the engine) reproduces the verdict."""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest

from runner.bundle import _command, _docker_arguments
from runner.containers import ContainerSpec, Mount
from runner.execute import KIND_LABEL, LABEL, LIB_MOUNT, RUN_MOUNT
from runner.sample.histories import Sample, SampleSpec
from runner.sample.packages import EXAMPLE_PATH
from tests.fixtures.cli import BASE_IMAGE, Cli, Finish, cli
from tests.fixtures.docker import build_from_text, remove_with_what_was_made_on_it

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(900)]

# A history of its own, so no other test shares (and removes) its images.
EXPORTED = SampleSpec(
    pypto_commits=6,
    simpler_commits=3,
    runtime_added_at=1,
    runtime_initial=1,
    bumps=((3, 2),),
    pypto_regression_at=4,
    libbacktrace_url_change_at=2,
    nested_submodule_at=2,
)


def run_bundle(bundle: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """./run.sh as a machine without the tool sees it: no venv on PATH, no PYTHONPATH."""
    clean = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **env}
    for name in ("HOME", "DOCKER_HOST", "DOCKER_CONFIG"):
        if name in os.environ:
            clean[name] = os.environ[name]
    return subprocess.run(
        ["./run.sh"], cwd=bundle, env=clean, capture_output=True, text=True, timeout=600
    )


def bundle_containers(client: docker.DockerClient) -> list[str]:
    found = client.containers.list(
        all=True, filters={"label": f"{KIND_LABEL}=bundle"}, ignore_removed=True
    )
    return [container.name for container in found]


@dataclass
class Exported:
    ledger: dict
    entry: dict
    bundle: Path
    cli: Cli


def bisect_and_export(
    finished_run: Finish,
    bisect: Callable[..., Cli],
    sample: Sample,
    tmp_path: Path,
    pick: Callable[[Cli, dict], dict],
    *extra: str,
    before_export: Callable[[], object] = lambda: None,
) -> Exported:
    """Bisect the sample (the test session's finished run first) and export the attempt `pick`
    chooses.

    Other test sessions sharing the engine remove the tool images that appeared while they ran,
    ours included; when that lands between the bisect and the export, bisect again in a fresh
    workdir (the wheels are cached, so only the image is rebuilt).
    """
    for round_ in range(3):
        workdir = tmp_path / f"work-{round_}"
        if round_ == 0:
            finished = finished_run(sample, *extra, to=workdir).result
        else:
            finished = bisect(sample, *extra, workdir=workdir)
        assert finished.returncode == 0, finished.stderr
        before_export()
        ledger = json.loads((workdir / "ledger.json").read_text())
        entry = pick(finished, ledger)
        bundle = tmp_path / f"bundle, {round_}"  # docker's --mount splits fields at commas
        exported = cli("export", entry["run_id"], "--workdir", str(workdir), "--to", str(bundle))
        if exported.returncode == 0:
            return Exported(ledger, entry, bundle, exported)
        assert "no longer in the Docker Engine" in exported.stderr, exported.stderr
    pytest.fail("another test session removed the test image three times in a row")


def culprit(finished: Cli, ledger: dict) -> dict:
    run_id = finished.json()["reproduce"].split()[-1]
    [entry] = [a for a in ledger["attempts"] if a["run_id"] == run_id]
    return entry


def a_good_run(finished: Cli, ledger: dict) -> dict:
    return next(a for a in ledger["attempts"] if a["verdict"] == "good" and a["image_id"])


def test_an_exported_bundle_reproduces_the_culprits_verdict_after_its_image_is_removed(
    sample_factory, finished, bisect, tmp_path, docker_client
):
    sample = sample_factory(EXPORTED)
    lib = tmp_path / "lib"  # a pypto-lib checkout of this test's own, edited after the bisect
    shutil.copytree(sample.lib, lib, symlinks=True)
    example = lib / EXAMPLE_PATH
    original = example.read_bytes()

    def edit_the_checkout() -> None:
        example.write_text(original.decode().replace("RTOL = 1e-5", "RTOL = 1.0"))

    exported = bisect_and_export(
        finished,
        bisect,
        sample,
        tmp_path,
        culprit,
        "--lib",
        str(lib),
        before_export=edit_the_checkout,
    )

    ledger, entry, bundle = exported.ledger, exported.entry, exported.bundle
    culprit_run = entry["run_id"]
    assert entry["verdict"] == "bad"
    assert json.loads((bundle / "attempt.json").read_text()) == entry
    environment = json.loads((bundle / "environment.json").read_text())
    assert environment["test_image_id"] == entry["image_id"]
    assert environment["base_image_id"] == ledger["inputs"]["base_image_id"]
    assert environment["devices"] == ["/dev/null:/dev/davinci0:rwm"]
    assert environment["recorded"]["builders"] == entry["builders"]
    assert environment["recorded"]["fingerprint"] == entry["fingerprint"]
    assert (bundle / "lib" / EXAMPLE_PATH).read_bytes() == original, "the example as it ran"
    assert not (bundle / "lib" / ".git").exists()
    with gzip.open(bundle / "image.tar.gz") as saved:
        assert saved.read(512)  # a gzipped `docker save` stream
    assert "run.sh" in (bundle / "README.md").read_text()

    moved = tmp_path / "elsewhere"  # the bundle does not depend on where it was written
    shutil.move(bundle, moved)
    # Another test session sharing the engine may have removed it already: gone is gone.
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(entry["image_id"], force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(entry["image_id"])

    result = run_bundle(moved)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "loading the test image" in result.stdout
    assert f"recorded verdict: bad ({entry['reason']}) [{culprit_run}]" in result.stdout
    assert "new verdict:      bad (" in result.stdout
    assert "does not match golden" in result.stdout
    assert "the verdict reproduces" in result.stdout
    assert docker_client.images.get(entry["image_id"]).labels[LABEL] == "1"
    assert "does not match golden" in (moved / "out" / "log.txt").read_text()
    assert list((moved / "out" / "build_output").iterdir()), "generated code lands in out/"
    assert bundle_containers(docker_client) == []

    judged_in_image = run_bundle(moved, BUNDLE_JUDGE="image")

    assert judged_in_image.returncode == 0, judged_in_image.stdout + judged_in_image.stderr
    assert "loading the test image" not in judged_in_image.stdout
    assert "the verdict reproduces" in judged_in_image.stdout
    assert bundle_containers(docker_client) == []


def test_a_good_verdicts_bundle_reproduces_and_says_so_when_it_no_longer_holds(
    sample_factory, finished, bisect, tmp_path, docker_client
):
    sample = sample_factory(EXPORTED)
    bundle = bisect_and_export(finished, bisect, sample, tmp_path, a_good_run).bundle

    unchanged = run_bundle(bundle)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "new verdict:      good (pass)" in unchanged.stdout
    # The recipient's copy of the example is changed: the run now misses its golden.
    example = bundle / "lib" / EXAMPLE_PATH
    example.write_text(example.read_text().replace("RTOL = 1e-5", "RTOL = -1.0"))

    result = run_bundle(bundle)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "recorded verdict: good (pass)" in result.stdout
    assert "the verdict does NOT reproduce" in result.stdout
    assert bundle_containers(docker_client) == []


def test_a_bundle_of_an_image_that_runs_as_another_user_reproduces_its_verdict(
    sample_factory, finished, bisect, tmp_path, docker_client
):
    """CANN images run as HwHiAiUser (`USER 1000`): run.sh made out/ for the caller alone, so
    the example could not write build_output/ there (PermissionError, a skip that did not
    reproduce). out/ is made writable for the image's user, as `run` makes the run directory."""
    base = build_from_text(
        docker_client,
        f"FROM {BASE_IMAGE}\nUSER 1000\n",
        {},
        # Tagged: removing what was made on it would take an untagged parent with it.
        tag=f"bisect-precision-test/user-1000-base:{os.getpid()}",
        labels={"bisect-precision-test.user-1000": "1"},
    )
    try:
        sample = sample_factory(EXPORTED)
        exported = bisect_and_export(
            finished, bisect, sample, tmp_path, culprit, "--base-image", base
        )
        assert exported.entry["verdict"] == "bad", exported.entry

        result = run_bundle(exported.bundle)
    finally:
        remove_with_what_was_made_on_it(docker_client, base)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "new verdict:      bad (" in result.stdout
    assert "the verdict reproduces" in result.stdout
    generated = list((exported.bundle / "out" / "build_output").rglob("*"))
    assert generated and {path.stat().st_uid for path in generated} == {1000}
    assert bundle_containers(docker_client) == []


def test_export_refuses_an_attempt_that_is_not_in_the_ledger_and_a_used_directory(
    sample_factory, finished, tmp_path
):
    sample = sample_factory(EXPORTED)
    workdir = tmp_path / "work"
    assert finished(sample, to=workdir).result.returncode == 0
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    run_id = json.loads((workdir / "ledger.json").read_text())["attempts"][0]["run_id"]

    missing = cli("export", "999-nothing", "--workdir", str(workdir), "--to", str(tmp_path / "b"))
    occupied = cli("export", run_id, "--workdir", str(workdir), "--to", str(used))

    assert missing.returncode == 2 and "no attempt '999-nothing'" in missing.stderr
    assert occupied.returncode == 2 and "not empty" in occupied.stderr
    assert (used / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "b").exists()


def test_an_export_stopped_by_a_ci_cancel_leaves_no_half_bundle(sample_factory, finished, tmp_path):
    """A CI job's cancel (SIGTERM; a dropped ssh session's SIGHUP goes the same way) mid-export
    killed the tool by the signal and left a truncated image.tar.gz beside a complete-looking
    run.sh, which the next export to the same place refused. It stops as Ctrl-C does: exit 130,
    nothing left."""
    sample = sample_factory(EXPORTED)
    workdir = tmp_path / "work"
    assert finished(sample, to=workdir).result.returncode == 0
    run_id = json.loads((workdir / "ledger.json").read_text())["attempts"][0]["run_id"]
    bundle = tmp_path / "bundle"
    command = [sys.executable, "-m", "runner.cli", "export", run_id, "--workdir", str(workdir)]
    process = subprocess.Popen(
        [*command, "--to", str(bundle)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(bundle.glob("image*")) and process.poll() is None:
        assert time.monotonic() < deadline, "the export never began writing its image"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr
    assert not bundle.exists() or not any(bundle.iterdir())
    again = cli(*command[3:], "--to", str(bundle))
    assert again.returncode == 0, again.stderr


def test_run_sh_hands_docker_every_value_verbatim_whatever_it_contains():
    awkward = "a b 'c' \"d\" $HOME `id` ; e\\f"
    spec = ContainerSpec(
        image="sha256:abc",
        command=["sh", "-c", "chown -R 2147480001:2147480002 /x", "python3", awkward],
        environment={"PTO2_RING_HEAP": "1", "ODD": awkward},
        mounts=[
            Mount("/somewhere/lib", LIB_MOUNT),
            Mount("/somewhere/run", RUN_MOUNT, read_only=False),
            Mount('/opt/pto isa,"2"', "/opt/pto isa"),
        ],
        devices=["/dev/davinci3:/dev/davinci3:rwm"],
        labels={KIND_LABEL: "example"},
    )
    words = " ".join([*_docker_arguments(spec), *_command(spec)])
    script = f'HERE="/b, dir"; OUT="$HERE/out"; OWNER=7:8; printf "%s\\n" {words}'

    argv = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()

    assert argv[argv.index("--env", argv.index("--env") + 1) + 1] == f"ODD={awkward}"
    # docker reads a --mount value as one CSV record
    mounts = [next(csv.reader([argv[i + 1]])) for i, word in enumerate(argv) if word == "--mount"]
    assert mounts == [
        ["type=bind", "source=/b, dir/lib", f"target={LIB_MOUNT}", "readonly"],
        ["type=bind", "source=/b, dir/out", f"target={RUN_MOUNT}"],
        ["type=bind", 'source=/opt/pto isa,"2"', "target=/opt/pto isa", "readonly"],
    ]
    assert argv[argv.index("--device") + 1] == "/dev/davinci3:/dev/davinci3:rwm"
    assert f"{KIND_LABEL}=bundle" in argv and f"{KIND_LABEL}=example" not in argv
    assert "--network" in argv and argv[argv.index("--network") + 1] == "none"
    assert argv[-5:] == ["sh", "-c", "chown -R 7:8 /x", "python3", awkward]


def test_a_run_of_an_earlier_session_is_exported_with_that_sessions_record(
    sample_factory, finished, bisect, tmp_path
):
    sample = sample_factory(EXPORTED)
    for round_ in range(3):  # see bisect_and_export: another session may remove our image
        workdir = tmp_path / f"work-{round_}"
        if round_ == 0:
            assert finished(sample, to=workdir).result.returncode == 0
        else:
            assert bisect(sample, workdir=workdir).returncode == 0
        first = json.loads((workdir / "ledger.json").read_text())
        entry = next(a for a in first["attempts"] if a["image_id"])
        assert bisect(sample, "--new-session", workdir=workdir).returncode == 0
        [name] = cli("status", "--workdir", str(workdir), "--json").json()["earlier_sessions"]
        found, named = str(tmp_path / f"found-{round_}"), str(tmp_path / f"named-{round_}")

        by_id = cli("export", entry["run_id"], "--workdir", str(workdir), "--to", found)
        by_name = cli(
            "export", entry["run_id"], "--workdir", str(workdir), "--session", name, "--to", named
        )

        if "no longer in the Docker Engine" not in by_id.stderr + by_name.stderr:
            break
    for result, bundle in ((by_id, found), (by_name, named)):
        assert result.returncode == 0, result.stderr
        assert json.loads(Path(bundle, "attempt.json").read_text()) == entry
        assert json.loads(Path(bundle, "session.json").read_text()) == first["inputs"]


def test_an_attempt_whose_image_and_wheels_were_removed_is_exported_after_reproduce(
    sample_factory, bisect, tmp_path, docker_client
):
    """Builds are dated by their commits, so `reproduce` rebuilds the recorded wheels bit for bit
    and makes the image `export` wants again."""
    sample = sample_factory(EXPORTED)
    workdir, cache = tmp_path / "work", tmp_path / "cache"
    finished = bisect(sample, "--cache-dir", str(cache), workdir=workdir)
    assert finished.returncode == 0, finished.stderr
    entry = culprit(finished, json.loads((workdir / "ledger.json").read_text()))
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(entry["image_id"], force=True)
    pruned = cli("cache", "prune", "--all", "--cache-dir", str(cache))
    assert pruned.returncode == 0 and "0.00 MB of wheels left" in pruned.stdout, pruned.stdout

    def export(to: Path) -> Cli:
        return cli("export", entry["run_id"], "--workdir", str(workdir), "--to", str(to))

    refused = export(tmp_path / "refused")
    assert refused.returncode == 2 and "run `reproduce` to rebuild it" in refused.stderr
    again = cli("reproduce", entry["run_id"], "--workdir", str(workdir))
    assert again.returncode == 0, again.stdout + again.stderr
    for package in sorted(entry["wheel_digests"]):
        digest = entry["wheel_digests"][package][:12]
        assert f"{package} wheel: the recorded file (rebuilt, sha256 {digest})" in again.stdout

    exported = export(tmp_path / "bundle")  # the image reproduce made: same base, same wheels

    assert exported.returncode == 0, exported.stderr
    environment = json.loads((tmp_path / "bundle" / "environment.json").read_text())
    assert environment["test_image_id"] != entry["image_id"]
    # The bundle runs the image it saved, and says which one the session recorded.
    facts = json.loads((tmp_path / "bundle" / "bundle.json").read_text())
    assert facts["image_id"] == environment["test_image_id"]
    assert facts["recorded_image_id"] == entry["image_id"]
    assert entry["image_id"] not in (tmp_path / "bundle" / "run.sh").read_text()
    ran = run_bundle(tmp_path / "bundle")
    assert ran.returncode == 0 and "the verdict reproduces" in ran.stdout, ran.stdout + ran.stderr


def test_a_bundle_states_the_verdict_the_sessions_limits_gave(sample_factory, bisect, tmp_path):
    """Under --max-abs-diff the known-bad commit's mismatch is within the limit: good, though
    the example printed a failure. The bundle and the export line say good, as the session did."""
    sample = sample_factory(EXPORTED)
    workdir = tmp_path / "work"
    stopped = bisect(sample, "--max-abs-diff", "0.01", workdir=workdir)
    assert stopped.returncode == 3, stopped.stderr  # the known-bad end passes under the limit
    ledger = json.loads((workdir / "ledger.json").read_text())
    bad_end = next(a for a in ledger["attempts"] if a["pypto_sha"] == sample.pypto_shas[-1])
    assert bad_end["verdict"] == "bad"  # as the example said; the limits judge it good

    exported = cli(
        "export", bad_end["run_id"], "--workdir", str(workdir), "--to", str(tmp_path / "b")
    )

    assert exported.returncode == 0, exported.stderr
    assert f"exported {bad_end['run_id']} (good " in exported.stdout
    readme = (tmp_path / "b" / "README.md").read_text()
    assert "- verdict: **good**" in readme
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["recorded"]["verdict"] == "good"
