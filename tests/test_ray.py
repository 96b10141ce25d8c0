"""Bisects on a real three-node Ray cluster on this machine (head + two fake-NPU workers)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.devices import Passthrough
from runner.errors import InfrastructureError
from runner.execute import (
    KIND_LABEL,
    LABEL,
    OWNER_LABEL,
    RUN_LABEL,
    RUN_MOUNT,
    ExampleRun,
    process_owner,
    tool_containers,
)
from runner.executor import BuildJob, RunJob
from runner.ray_executor import (
    NODE_DIR_ENV,
    NodeSettings,
    RayExecutor,
    _auth_hint,
    _cluster_messages_to_stderr,
    _none_left,
    _require_image,
    _sweep_dead_runs,
)
from runner.sample.demo import on_simulator
from runner.sample.histories import SampleSpec
from runner.sample.packages import EXAMPLE_PATH
from runner.sources import SourceExporter
from runner.wheels import BuildSettings, WheelCache
from tests.fixtures.attempts import example_job
from tests.fixtures.cli import BASE_IMAGE, Cli, cli, run_args
from tests.fixtures.ray import LOOPBACK_ONLY
from tests.fixtures.samples import SMALL

# Every test here starts Ray or a cluster of it: `make test` runs them in the Docker tests'
# process, one at a time, so two local clusters never compete for the machine's ports and cores.
pytestmark = pytest.mark.ray

RUN_SECONDS = 2  # long enough to kill a worker while its example runs
# A regression in a simpler commit inside a bump: both levels are bisected.
TWO_LEVEL = SampleSpec(**SMALL, bumps=((4, 5), (6, 6)), simpler_regression_at=3)


def without_device(args: list[str]) -> list[str]:
    """`run` arguments for Ray, which picks the cards itself (`--device` is warned about)."""
    at = args.index("--device")
    return [*args[:at], *args[at + 2 :], "--executor", "ray"]


def ray_bisect(sample, work: Path, cache: Path, cluster) -> Cli:
    args = run_args(sample, work, cache, "--executor", "ray", "--ray-address", cluster.address)
    return cli(*args, "--json", env=cluster.env)


@pytest.fixture(scope="module")
def ray_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's cache: wheels its nodes built for one test serve the next."""
    return tmp_path_factory.mktemp("ray-cache")


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_driver(
    sample, work: Path, cache: Path, cluster, output: str = "--json"
) -> subprocess.Popen:
    """`run --executor ray` in the background, each example taking RUN_SECONDS."""
    args = run_args(sample, work, cache, "--executor", "ray", "--ray-address", cluster.address)
    args += ["--run-env", f"SAMPLE_RUN_SECONDS={RUN_SECONDS}", output]
    return subprocess.Popen(
        [sys.executable, "-m", "runner.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", **cluster.env},
    )


def recorded(work: Path) -> list[dict]:
    try:
        return json.loads((work / "ledger.json").read_text())["attempts"]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def in_process_executor(cluster, cache: Path, echo=None, **node: object) -> RayExecutor:
    """This test process as the driver, with the settings of the CLI tests (NPU, /dev/null)."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    settings = {
        "platform": "a2a3",
        "device_mode": "explicit",
        "device_map": ("/dev/null:/dev/davinci0",),
        "cards_per_test": 1,
        "cpus": None,
        "cache_root": str(cache),
        "probe": str(cache / "probe"),
        **node,
    }
    starved = settings.pop("starved_s", 60.0)
    return RayExecutor(
        ray,
        WheelCache(cache / "wheels"),
        NodeSettings(**settings),
        owns_connection=True,
        starved_s=starved,
        echo=echo,
    )


def run_id_of(container: dict) -> str:
    """The attempt an example container runs: its run folder is mounted at /bisect/run."""
    mount = next(m for m in container["Mounts"] if m["Destination"] == RUN_MOUNT)
    return Path(mount["Source"]).name


def eventually(check, seconds: float = 10.0) -> bool:
    """Streamed lines reach the driver a moment after the task that sent them ends."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def culprits(report: dict) -> tuple:
    simpler = report["simpler"] or {}
    return report["source"], report["pypto"]["first_bad"], simpler.get("culprit")


def rounds(report: dict) -> int:
    return len({step["round"] for step in report["steps"]})


def test_importing_the_cli_never_imports_ray():
    code = "import sys, runner.cli, runner.workflow; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.docker
def test_a_node_task_cut_short_leaves_none_of_its_workers_containers(docker_client, base_image):
    """Ray's cancel interrupts a task anywhere, also between a container's creation and the
    `finally` that removes it: when the task ends, what its worker owns goes."""
    with pytest.raises(KeyboardInterrupt), _none_left(docker_client):
        docker_client.containers.create(
            base_image, ["sleep", "60"], labels={LABEL: "1", **process_owner()}
        )
        raise KeyboardInterrupt

    assert tool_containers(docker_client, run=process_owner()[RUN_LABEL]) == []


@pytest.mark.docker
def test_executor_ray_without_the_extra_says_how_to_install(sample_factory, tmp_path):
    """Ray blocked in the import system, as in an install without the extra."""
    sample = sample_factory(TWO_LEVEL)
    hide = (
        "import runpy, sys\n"
        "sys.modules['ray'] = None  # what Python makes of a module that is not installed\n"
        "sys.argv[0] = 'bisect-precision-docker'\n"
        "runpy.run_module('runner.cli', run_name='__main__')\n"
    )
    args = without_device(run_args(sample, tmp_path / "work", tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", hide, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "pip install 'bisect-precision-docker[ray]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.docker
def test_a_cluster_address_nobody_answers_fails_in_seconds_with_one_line(
    sample_factory, tmp_path, unused_port
):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed; pip install -e '.[ray]'")
    sample = sample_factory(TWO_LEVEL)
    address = f"127.0.0.1:{unused_port}"
    args = without_device(run_args(sample, tmp_path / "w", tmp_path / "c"))
    started = time.monotonic()

    result = cli(*args, "--ray-address", address, env=LOOPBACK_ONLY, timeout=120)

    assert result.returncode == 4
    assert f"no Ray cluster answers at {address}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 60
    for malformed in ("garbage", f"http://127.0.0.1:{unused_port}"):
        refused = cli(*args, "--ray-address", malformed, env=LOOPBACK_ONLY, timeout=120)
        assert refused.returncode == 2, refused.stderr  # bad input, not the machine's fault
        [line] = refused.stderr.strip().splitlines()
        assert line == (
            f"error: --ray-address {malformed}: give the head's HOST:PORT (its GCS port, 6379 "
            "unless `ray start --head --port` said otherwise), or auto"
        )
    client = f"ray://127.0.0.1:{unused_port}"
    refused = cli(*args, "--ray-address", client, env=LOOPBACK_ONLY, timeout=120)
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "Ray Client addresses are not supported; run the tool on a node" in line, line


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_two_level_regression_on_three_nodes_gives_the_local_culprits_in_fewer_rounds(
    sample_factory, bisect, ray_cluster, ray_cache, tmp_path
):
    sample = sample_factory(TWO_LEVEL)
    local = bisect(sample, workdir=tmp_path / "local")
    assert local.returncode == 0, local.stderr

    started = time.monotonic()
    result = ray_bisect(sample, tmp_path / "ray", ray_cache, ray_cluster)
    print(f"ray bisect: {time.monotonic() - started:.1f}s")

    assert result.returncode == 0, result.stderr
    report, baseline = result.json(), local.json()
    assert culprits(report) == culprits(baseline)
    assert culprits(report) == ("simpler", sample.pypto_shas[4], sample.simpler_shas[3])
    print(f"rounds: local {rounds(baseline)}, ray {rounds(report)}")
    assert rounds(report) < rounds(baseline)
    workers = {str(node.node_id)[:8] for node in ray_cluster.workers}
    for step in report["steps"]:
        assert step["node"].split("/")[-1] in workers, step
        assert step["device"] == "0"
    assert len({step["node"] for step in report["steps"]}) == 2, "both workers ran examples"
    assert any(len([s for s in report["steps"] if s["round"] == r]) == 2 for r in range(1, 20))
    ledger = json.loads((tmp_path / "ray" / "ledger.json").read_text())
    made = [s["simpler"] for s in report["steps"] if s["builds"].get("simpler") == "built"]
    made += [b["commit"] for b in ledger["ahead"] if b["package"] == "simpler"]
    assert made and len(made) == len(set(made)), "each simpler commit built once on the cluster"
    md = (tmp_path / "ray" / "report.md").read_text()
    assert f"0@{report['steps'][0]['node']}" in md, "the steps table says where each ran"
    fingerprint = ledger["attempts"][0]["fingerprint"]
    assert {"kernel", "driver", "base_image_id"} <= set(fingerprint)


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_worker_then_the_driver_killed_mid_run_change_nothing_but_the_wall_time(
    sample_factory, ray_cluster, ray_cache, docker_client, tmp_path
):
    """One bisect, two faults: a worker dies while its example runs (Ray re-runs the task on the
    other worker), then the driver is SIGKILLed and the bisect is resumed with the same flags."""
    sample = sample_factory(TWO_LEVEL)
    work = tmp_path / "work"
    driver = start_driver(sample, work, ray_cache, ray_cluster)
    killed = lost_run = None
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 300
        while killed is None and driver.poll() is None and time.monotonic() < deadline:
            # One listing call: a container may be gone by the time a second call asks about it.
            for container in docker_client.api.containers(
                filters={"label": [f"{LABEL}=1", f"{KIND_LABEL}=example"]}
            ):
                owner = container["Labels"][OWNER_LABEL]
                node = ray_cluster.worker_of(int(owner.rpartition(":")[2]))
                if node is not None:
                    killed = str(node.node_id)[:8]
                    ray_cluster.kill_worker(node)
                    lost_run = run_id_of(container)
                    break
            time.sleep(0.2)
        while driver.poll() is None and time.monotonic() < deadline:
            if any(a["run_id"] == lost_run for a in recorded(work)):
                break  # the lost attempt is done elsewhere: now the driver goes
            time.sleep(0.2)
    finally:
        driver.kill()  # SIGKILL: no cleanup of its own, its Ray tasks die with it
        _out, killed_err = driver.communicate()
        ray_cluster.add_worker()
    assert killed is not None, "no example ran on a worker to kill"
    # The lost node is news in a line or two, not the raylet's last log lines.
    assert "[state-dump]" not in killed_err and ".cc:" not in killed_err, killed_err
    before = recorded(work)

    out, err = start_driver(sample, work, ray_cache, ray_cluster).communicate(timeout=600)
    print(f"ray bisect with a worker and the driver killed: {time.monotonic() - started:.1f}s")

    assert culprits(json.loads(out)) == ("simpler", sample.pypto_shas[4], sample.simpler_shas[3]), (
        err
    )
    after = recorded(work)
    assert after[: len(before)] == before, "what the killed driver recorded is kept as it was"
    assert len({a["run_id"] for a in after}) == len(after)
    rerun = [a for a in after if a["run_id"] == lost_run]
    assert len(rerun) == 1, "the lost attempt ran again, and is recorded once"
    assert killed not in rerun[0]["node"], "nothing is recorded from the node that died"
    nodes = os.environ[NODE_DIR_ENV]  # where this cluster's nodes run examples from
    orphans = [
        c["Names"]
        for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
        if any(str(m["Source"]).startswith(nodes) for m in c["Mounts"])
    ]
    assert orphans == [], "the containers of the lost run and of the killed driver were removed"


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_node_that_shares_no_disk_with_the_driver_gets_sources_wheels_and_lib_through_ray(
    sample_factory, ray_cluster, base_image, docker_client, builder_for_setuptools, tmp_path
):
    sample = sample_factory(TWO_LEVEL)
    commit = sample.pypto_shas[0]
    cache = tmp_path / "cache"
    exporter = SourceExporter(sample.pypto, cache)
    settings = BuildSettings(
        base_image=BASE_IMAGE, base_image_id=docker_client.images.get(BASE_IMAGE).id
    )
    lines: list[str] = []  # --verbose: the nodes' logs stream to the driver
    executor = in_process_executor(ray_cluster, cache, echo=lines.append, shared=False)
    try:
        assert len(executor.slots) == 2
        job = BuildJob(
            package="pypto",
            commit=commit,
            prepare=lambda dest: exporter.export(commit, dest),
            settings=settings,
            builder=builder_for_setuptools,
            ccache_dir=tmp_path / "ccache",
        )
        wheel = executor.build(job).result(timeout=300)
        assert wheel.ok and not wheel.from_cache, wheel.reason
        assert eventually(lambda: any(".whl" in line for line in lines)), lines
        assert wheel.wheel is not None and wheel.wheel.is_relative_to(cache / "wheels")
        assert executor.build(job).result(timeout=60).from_cache, "built once, then the cache"

        artifacts = tmp_path / "runs" / "001-sample"
        report = executor.run(
            example_job(
                wheel, BASE_IMAGE, settings.base_image_id, sample.lib, artifacts, "a2a3", commit
            )
        ).result(timeout=300)
    finally:
        executor.close(cancel=True)

    result = report.result
    assert result is not None and result.exit_code == 0, result
    assert "[RUN] PASS" in result.output
    assert result.log_path == artifacts / "log.txt" and "[RUN] PASS" in result.log_path.read_text()
    assert list(artifacts.glob("build_output/*/kernels/aiv/*.cpp")), "generated code came back"
    workers = {str(node.node_id)[:8] for node in ray_cluster.workers}
    assert report.slot is not None and report.slot.node.split("/")[-1] in workers
    assert report.slot.device == "0"
    assert {"kernel", "driver", "npu_smi", "base_image_id"} <= set(report.facts)
    node = report.slot.node
    ran = [line for line in lines if line.startswith(f"[{node}] [RUN] PASS")]
    assert ran, "the run's output, named by its node"
    assert all(line.startswith(f"[{node.split('/')[0]}/") for line in lines)


@pytest.mark.timeout(120)
def test_a_run_no_live_node_can_take_fails_as_infrastructure_instead_of_waiting_for_ever(
    ray_cluster, tmp_path
):
    wheel = tmp_path / "pypto-0-py3-none-any.whl"
    wheel.write_bytes(b"never installed: no node can take the run")
    executor = in_process_executor(ray_cluster, tmp_path / "cache", cards_per_test=3, starved_s=2)
    job = RunJob(
        pypto="0" * 40,
        simpler=None,
        pypto_wheel=wheel,
        simpler_wheel=None,
        pip_wheel=None,
        base_image=BASE_IMAGE,
        base_image_id="sha256:" + "0" * 64,
        run=ExampleRun(
            image="",
            lib_dir=tmp_path,
            script=EXAMPLE_PATH,
            platform="a2a3",
            device="0",
            artifacts_dir=tmp_path / "runs" / "001",
            passthrough=Passthrough(),
        ),
    )
    try:
        assert executor.slots == [], "two cards in the cluster, three per test"
        with pytest.raises(InfrastructureError, match="waited 2s for a Ray node with NPU"):
            executor.run(job).result(timeout=60)
    finally:
        executor.close(cancel=True)


def test_a_node_without_the_sessions_base_image_says_how_to_bring_it(docker_client, monkeypatch):
    # Outside a Ray task the node's name would start Ray in this process: name it here.
    monkeypatch.setattr("runner.ray_executor.node_name", lambda: "host/0123abcd")
    missing = "sha256:" + "0" * 64
    with pytest.raises(
        InfrastructureError,
        match=r"node host/0123abcd lacks the base image sha256:000.*docker load",
    ):
        _require_image(docker_client, missing, "base image")


def test_a_killed_workers_run_folder_is_removed_by_the_next_run_on_the_node(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"run-{dead.pid}-abc" / "001-run"
    left.mkdir(parents=True)
    live = tmp_path / f"run-{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "run-notapid"
    other.mkdir()

    _sweep_dead_runs(tmp_path)

    assert not left.parent.exists()
    assert live.is_dir() and other.is_dir()


def test_a_refused_join_mentions_token_authentication_only_when_a_token_is_there(
    tmp_path, monkeypatch
):
    token = tmp_path / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert _auth_hint() == ""
    token.write_text("secret\n")
    assert "set RAY_AUTH_MODE=token" in _auth_hint()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert _auth_hint() == "", "already asked for: the cause is elsewhere"


def test_cluster_messages_go_to_stderr_without_colour_codes_off_a_terminal(capsys, monkeypatch):
    """Ray's own printer, as the driver calls it for a raylet event: in a CI log or a file the
    line must read "(raylet) ...", not carry escape codes."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_COLOR_PREFIX", "unset below; restored after the test")
    monkeypatch.delenv("RAY_COLOR_PREFIX")
    worker = ray._private.worker
    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)
    _cluster_messages_to_stderr(ray)

    event = "Raylet is terminated. Termination is unexpected."
    worker.print_to_stdstream(
        {"pid": "raylet", "ip": "10.0.0.2", "localhost": "10.0.0.1", "lines": [event]},
        ignore_prefix=False,
    )

    out, err = capsys.readouterr()
    assert out == ""
    assert f"(raylet, ip=10.0.0.2) {event}" in err
    assert "\x1b[" not in err


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_an_interrupted_ray_driver_says_so_and_leaves_no_container_on_any_node(
    signal_number, sample_factory, ray_cluster, ray_cache, docker_client, tmp_path
):
    """Ctrl-C (or a CI runner's SIGTERM) while examples run on the workers: exit 130 with the
    tool's own line, and the nodes' containers removed before the driver goes (Ray's fatal-signal
    handler used to dump a stack and kill the driver with 15 or 134). With --verbose the nodes'
    logs stream to the driver until then."""
    sample = sample_factory(TWO_LEVEL)
    work = tmp_path / "work"
    output = "--verbose" if signal_number == signal.SIGINT else "--json"
    driver = start_driver(sample, work, ray_cache, ray_cluster, output)
    nodes = os.environ[NODE_DIR_ENV]  # where this cluster's nodes run examples from

    def ours() -> list[str]:
        return [
            c["Names"][0]
            for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
            if any(str(m["Source"]).startswith(nodes) for m in c["Mounts"])
        ]

    workers = {str(node.node_id)[:8] for node in ray_cluster.workers}
    lines: list[str] = []  # the driver's stderr as it comes

    def read() -> None:
        assert driver.stderr is not None
        for line in driver.stderr:
            lines.append(line)

    def streamed() -> bool:
        """A line of a node's log reached the driver (names its node: `[host/node] ...`)."""
        return any(line.split("]")[0].split("/")[-1] in workers for line in list(lines))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while driver.poll() is None and time.monotonic() < deadline:
            examples = docker_client.api.containers(
                filters={"label": [f"{LABEL}=1", f"{KIND_LABEL}=example"]}
            )
            running = any(c["Labels"][OWNER_LABEL].split(":")[0] for c in examples) and ours()
            # With --verbose the example's first lines stream while it runs, within a second.
            if running and (output != "--verbose" or streamed()):
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the bisect ended before an example ran on a node"
        driver.send_signal(signal_number)
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    reader.join(timeout=30)
    err = "".join(lines)

    assert driver.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted:"), err
    assert "SIGTERM received" not in err and "PC: @" not in err
    assert ours() == [], "the interrupted run's containers were left on the nodes"
    assert streamed() == (output == "--verbose"), err


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_simulator_runs_on_ray_are_lane_0_of_their_container_whatever_device_says(
    sample_factory, ray_cluster, ray_cache, tmp_path
):
    """Examples parse `-d` as one lane; `--device 0,1` used to reach every Ray run as `-d 0,1`."""
    sample = sample_factory(TWO_LEVEL)
    args = run_args(sample, tmp_path / "work", ray_cache, "--executor", "ray")
    args = on_simulator([*args, "--ray-address", ray_cluster.address], "0,1")

    result = cli(*args, env=ray_cluster.env)

    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert culprits(report) == ("simpler", sample.pypto_shas[4], sample.simpler_shas[3])
    assert {step["device"] for step in report["steps"]} == {"0"}
    assert "--device is not used with --executor ray" in result.stderr
    header = (tmp_path / "work" / "report.md").read_text().split("\n## ")[0]
    assert "device 0,1" not in header
    nodes = sorted({step["node"] for step in report["steps"]})
    assert f"0@{nodes[0]}" in header and "(placed by Ray)" in header, header


@pytest.mark.docker
def test_a_card_that_fails_on_ray_is_warned_about_and_named_with_its_node(
    sample_factory, ray_cluster, ray_cache, tmp_path
):
    """A card whose device the example cannot open (aclInit) is a device fault, never a verdict:
    the first one takes a card out of the pool (said on stderr without --verbose, --json or
    not); the second, on the last card, stops."""
    sample = sample_factory(TWO_LEVEL)
    args = run_args(sample, tmp_path / "work", ray_cache, "--ray-address", ray_cluster.address)
    args = without_device(args)
    args[args.index("--device-map") + 1] = "/dev/null:/dev/davinci9"  # no card's own node

    result = cli(*args, "--infra-retries", "2", "--json", env=ray_cluster.env)

    assert result.returncode == 4, result.stderr
    assert "aclInit failed" in result.stderr.splitlines()[-1]
    [warning] = [line for line in result.stderr.splitlines() if "out of the pool" in line]
    assert warning.startswith("warning: device 0 on ") and "one slot fewer" in warning
    assert "2 infrastructure failures in a row" in result.stderr
    assert not recorded(tmp_path / "work"), "a timeout is never a verdict"
    log = (tmp_path / "work" / "infrastructure.log").read_text()
    workers = {str(node.node_id)[:8] for node in ray_cluster.workers}
    retired = [line for line in log.splitlines() if "taken out of the pool: device 0@" in line]
    assert len(retired) == 1 and any(worker in retired[0] for worker in workers), log


def test_a_node_without_a_docker_engine_is_named(monkeypatch):
    """The driver's engine may be fine: the error says which node has none."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed; pip install -e '.[ray]'")
    from runner import ray_executor
    from runner.errors import InfrastructureError

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(ray_executor, "node_name", lambda: "npu-host-7/1a2b3c4d")

    with pytest.raises(InfrastructureError, match=r"^Ray node npu-host-7/1a2b3c4d: no Docker"):
        ray_executor._node_engine()
