"""Containers on the real Docker Engine: output, limits, isolation, devices and, always, cleanup.

Every Docker test here is also watched by the fixture that fails a test leaving a labelled
container behind, so "the container is removed" is checked even where no assert says it.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import docker.errors
import pytest

from runner.containers import ContainerSpec, Mount
from runner.devices import Passthrough, passthrough
from runner.errors import BadInput, InfrastructureError
from runner.execute import (
    KIND_LABEL,
    LABEL,
    LIB_MOUNT,
    OWNER_LABEL,
    PROCESS_LABEL,
    RUN_LABEL,
    RUN_MOUNT,
    ExampleRun,
    ImageDefaults,
    _LogPump,
    connect,
    example_container,
    process_owner,
    remove_own_containers,
    remove_stale_containers,
    run_container,
    run_example,
    tool_containers,
)
from runner.sample.packages import EXAMPLE_PATH, write_lib, write_pypto

docker_test = pytest.mark.docker


def labelled_containers(client: docker.DockerClient) -> list[str]:
    """Containers this test process owns right now."""
    return [container.name for container in tool_containers(client, run=process_owner()[RUN_LABEL])]


def shell(image: str, script: str, **fields: object) -> ContainerSpec:
    return ContainerSpec(image=image, command=["sh", "-c", script], **fields)  # type: ignore[arg-type]


@pytest.fixture
def lib_dir(tmp_path: Path) -> Path:
    """A pypto-lib checkout with the sample example; pypto itself sits at its root, so
    PYTHONPATH=/bisect/lib finds it in the plain base image."""
    root = tmp_path / "pypto-lib"
    write_lib(root)
    write_pypto(root, revision=1, uses_simpler=False)
    return root


def example(
    image: str, lib_dir: Path, artifacts: Path, platform: str = "a2a3sim", **fields: object
) -> ExampleRun:
    return ExampleRun(  # type: ignore[arg-type]
        image=image,
        lib_dir=lib_dir,
        script=EXAMPLE_PATH,
        platform=platform,
        device="0",
        artifacts_dir=artifacts,
        passthrough=fields.pop("passthrough", Passthrough()),  # type: ignore[arg-type]
        **fields,
    )


# --- plain containers ------------------------------------------------------------------------


@docker_test
def test_exit_code_and_both_streams_are_captured(docker_client, base_image, tmp_path):
    """Docker keeps each stream's order but not the interleaving of stdout with stderr."""
    log = tmp_path / "logs" / "run.txt"
    seen: list[str] = []
    spec = shell(base_image, "echo out-1; echo err-1 >&2; echo out-2; echo err-2 >&2; exit 7")

    result = run_container(docker_client, spec, log_path=log, echo=seen.append)

    assert result.exit_code == 7
    assert not result.timed_out
    assert not result.oom_killed
    assert sorted(result.output.splitlines()) == ["err-1", "err-2", "out-1", "out-2"]
    assert result.output.index("out-1") < result.output.index("out-2")
    assert result.output.index("err-1") < result.output.index("err-2")
    assert log.read_text() == result.output
    assert seen == result.output.splitlines()
    assert labelled_containers(docker_client) == []


@docker_test
def test_a_last_line_without_newline_is_kept(docker_client, base_image, tmp_path):
    seen: list[str] = []
    spec = shell(base_image, "echo first; printf 'ünïcode without newline'")

    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt", echo=seen.append)

    assert result.output == "first\nünïcode without newline"
    assert seen == ["first", "ünïcode without newline"]


@docker_test
def test_what_the_follow_stream_missed_is_read_back_once_the_container_exited(
    docker_client, base_image, tmp_path
):
    """The engine's follow stream can end before it passes on the last bytes (seen under load):
    the pump reads the whole log once the container has exited and adds the missing tail."""
    container = docker_client.containers.create(
        base_image,
        ["sh", "-c", "echo first; echo second; printf 'ünïcode without newline'"],
        labels={LABEL: "1", **process_owner()},
    )
    try:
        container.start()
        container.wait()
        seen: list[str] = []
        log = tmp_path / "log.txt"
        log.write_text("first\n")
        pump = _LogPump(container, log, seen.append, threading.Event())
        pump.chunks = ["first\n"]  # what a stream that ended early delivered

        pump.catch_up()

        assert pump.output == "first\nsecond\nünïcode without newline"
        assert log.read_text() == pump.output
        assert seen == ["second", "ünïcode without newline"]
        pump.catch_up()  # nothing is added twice
        assert pump.output == "first\nsecond\nünïcode without newline"
    finally:
        container.remove(force=True)


@docker_test
def test_the_container_has_no_network(docker_client, base_image, tmp_path):
    probe = (
        "import os, socket\n"
        "print('interfaces', sorted(os.listdir('/sys/class/net')))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no route', exc.errno)\n"
    )
    for sandbox in (False, True):
        spec = ContainerSpec(image=base_image, command=["python3", "-c", probe], sandbox=sandbox)

        result = run_container(docker_client, spec, log_path=tmp_path / f"log-{sandbox}.txt")

        assert result.exit_code == 0, result.output
        assert "interfaces ['lo']" in result.output
        assert "no route" in result.output
        assert "connected" not in result.output


@docker_test
def test_only_the_example_gets_the_engines_network_sandbox(docker_client, base_image, tmp_path):
    """An example run resolves localhost as under `docker run --network none`; builds, layers and
    probes start without the sandbox that needs, which is half a container's start-up cost."""
    resolve = "import socket; print('localhost is', socket.getaddrinfo('localhost', 80)[0][4][0])"
    seen: dict[str, object] = {}

    def inspect(container, result):
        seen[container.labels[KIND_LABEL]] = container.attrs["Config"].get("NetworkDisabled")

    resolver = ContainerSpec(
        image=base_image,
        command=["python3", "-c", resolve],
        sandbox=True,
        labels={KIND_LABEL: "example"},
    )
    result = run_container(
        docker_client, resolver, log_path=tmp_path / "example.txt", before_removal=inspect
    )
    assert result.exit_code == 0, result.output
    assert "localhost is 127.0.0.1" in result.output or "localhost is ::1" in result.output
    assert example_container(example(base_image, tmp_path / "lib", tmp_path / "run")).sandbox

    build = ContainerSpec(image=base_image, command=["true"], labels={KIND_LABEL: "build"})
    result = run_container(
        docker_client, build, log_path=tmp_path / "build.txt", before_removal=inspect
    )
    assert result.exit_code == 0, result.output
    assert seen == {"example": None, "build": True}  # the engine leaves out a false flag


@docker_test
def test_environment_and_read_only_mounts_arrive(docker_client, base_image, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "input.txt").write_text("from the host\n")
    spec = shell(
        base_image,
        'echo "value=$BISECT_VALUE"; cat /data/input.txt; id -u; touch /data/new',
        environment={"BISECT_VALUE": "42"},
        mounts=[Mount(str(data), "/data")],
        user="1234:1234",
    )

    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt")

    assert "value=42" in result.output
    assert "from the host" in result.output
    assert "1234" in result.output
    assert "Read-only file system" in result.output
    assert result.exit_code != 0
    assert not (data / "new").exists()


@docker_test
def test_a_timeout_kills_and_removes_the_container(docker_client, base_image, tmp_path):
    spec = shell(base_image, "echo started; sleep 60")

    started = time.monotonic()
    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt", timeout=1.5)

    assert time.monotonic() - started < 8
    assert result.timed_out
    assert result.exit_code is None
    assert 1.5 <= result.seconds < 8
    assert "started" in (tmp_path / "log.txt").read_text()
    assert labelled_containers(docker_client) == []


@docker_test
def test_a_container_that_ends_before_its_timeout_is_not_timed_out(
    docker_client, base_image, tmp_path
):
    result = run_container(
        docker_client, shell(base_image, "exit 0"), log_path=tmp_path / "log.txt", timeout=60
    )

    assert result.exit_code == 0
    assert not result.timed_out
    assert result.seconds < 30


@docker_test
def test_memory_exhaustion_is_reported_as_oom_killed(docker_client, base_image, tmp_path):
    spec = ContainerSpec(
        image=base_image,
        command=["python3", "-c", "blocks = [bytearray(1 << 20) for _ in range(512)]"],
        mem_limit="64m",
    )

    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt", timeout=60)

    assert result.oom_killed
    assert result.exit_code == 137


@docker_test
def test_ctrl_c_from_the_echo_callback_still_removes_the_container(
    docker_client, base_image, tmp_path
):
    def echo(line: str) -> None:
        if line == "ready":
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_container(
            docker_client,
            shell(base_image, "echo ready; sleep 60"),
            log_path=tmp_path / "log.txt",
            echo=echo,
        )

    assert time.monotonic() - started < 20
    assert labelled_containers(docker_client) == []


@docker_test
def test_ctrl_c_in_the_main_thread_mid_run_still_removes_the_container(
    docker_client, base_image, tmp_path
):
    seen = threading.Event()
    timer = threading.Timer(0, _thread.interrupt_main)

    def echo(line: str) -> None:
        if line == "ready" and not seen.is_set():
            seen.set()
            timer.start()

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_container(
            docker_client,
            shell(base_image, "echo ready; sleep 60"),
            log_path=tmp_path / "log.txt",
            echo=echo,
        )
        time.sleep(30)  # only reached if the interrupt missed the run

    timer.join()
    assert time.monotonic() - started < 20
    assert labelled_containers(docker_client) == []


@docker_test
@pytest.mark.parametrize("interrupt", ["sigint", "sighup", "interrupt_main"])
@pytest.mark.parametrize("call", ["create_container", "remove_container"])
def test_an_interrupt_while_the_engine_creates_or_removes_the_container_still_removes_it(
    call, interrupt, docker_client, base_image, tmp_path, monkeypatch
):
    """The interrupt lands between sending the request and the engine acting on it: a Ctrl-C
    on a loaded engine, or Ray's cancel of a task (`interrupt_main` in its worker). A create
    the engine finished after the cleanup had looked for the container, or a remove never
    sent, left the container behind."""
    real = getattr(docker_client.api, call)
    engine: list[threading.Thread] = []

    def interrupted(*args: object, **kwargs: object) -> object:
        answer: list[object] = []
        slow = threading.Thread(
            target=lambda: (time.sleep(0.5), answer.append(real(*args, **kwargs)))
        )
        engine.append(slow)
        if call == "create_container":
            slow.start()  # the request is on its way; the engine answers later
        if interrupt == "interrupt_main":
            _thread.interrupt_main()
        else:
            os.kill(os.getpid(), signal.SIGHUP if interrupt == "sighup" else signal.SIGINT)
        time.sleep(0.2)  # the interrupt reaches the main thread meanwhile
        if call == "remove_container":
            slow.start()  # sent after the interrupt: only a caller that holds it sends it
        slow.join()
        return answer[0]

    monkeypatch.setattr(docker_client.api, call, interrupted)
    previous = signal.signal(signal.SIGHUP, signal.default_int_handler)  # as the CLI has it
    try:
        with pytest.raises(KeyboardInterrupt):
            run_container(docker_client, shell(base_image, "true"), log_path=tmp_path / "log")
            time.sleep(30)  # only reached if the interrupt got lost
    finally:
        signal.signal(signal.SIGHUP, previous)

    for slow in engine:
        if slow.ident is not None:
            slow.join()
    assert labelled_containers(docker_client) == []


@docker_test
def test_a_log_that_cannot_be_written_is_the_runs_error_not_a_thread_traceback(
    docker_client, base_image, tmp_path, monkeypatch
):
    """As on a full disk: the log file's error reaches the caller, no thread dies loudly."""
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: died.append(hook.exc_value))
    (tmp_path / "log").mkdir()  # the log file's name is taken by a directory

    with pytest.raises(IsADirectoryError):
        run_container(docker_client, shell(base_image, "echo hi"), log_path=tmp_path / "log")

    assert died == []
    assert labelled_containers(docker_client) == []


@docker_test
def test_an_image_gone_while_in_use_is_infrastructure_not_bad_input(docker_client, tmp_path):
    """The base image is checked up front; a tool image that vanished was pruned meanwhile."""
    spec = ContainerSpec(image="bisect-precision-no-such-image:latest", command=["true"])

    with pytest.raises(InfrastructureError) as error:
        run_container(docker_client, spec, log_path=tmp_path / "log.txt")

    assert "disappeared from the Docker Engine" in str(error.value)
    assert "\n" not in str(error.value)


@docker_test
def test_a_container_that_cannot_start_is_an_infrastructure_error_and_is_removed(
    docker_client, base_image, tmp_path
):
    spec = ContainerSpec(
        image=base_image, command=["true"], devices=["/dev/no-such-npu:/dev/davinci0:rwm"]
    )

    with pytest.raises(InfrastructureError) as error:
        run_container(docker_client, spec, log_path=tmp_path / "log.txt")

    assert "\n" not in str(error.value)
    assert "/dev/no-such-npu" in str(error.value)
    assert labelled_containers(docker_client) == []


def test_no_engine_is_an_infrastructure_error_that_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")

    with pytest.raises(InfrastructureError, match="start dockerd or set DOCKER_HOST"):
        connect()


# --- cleanup of other runs' containers ---------------------------------------------------------


def dead_pid() -> int:
    """A pid no process can have (above the kernel's limit): a reaped child's may be reused."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def started_container(client: docker.DockerClient, image: str, labels: dict[str, str]):
    container = client.containers.create(
        image, ["sleep", "60"], labels={LABEL: "1", **labels}, network_mode="none"
    )
    container.start()
    return container


def owner(**changes: str) -> dict[str, str]:
    """This process's owner labels, with some changed to describe another process."""
    labels = process_owner()
    labels[RUN_LABEL] = "another-run"
    namespace, boot, started = labels[PROCESS_LABEL].split(";")
    parts = {"namespace": namespace, "boot": boot, "started": started}
    for key in ("namespace", "boot", "started"):
        parts[key] = changes.pop(key, parts[key])
    labels[PROCESS_LABEL] = ";".join(parts.values())
    if "pid" in changes:
        labels[OWNER_LABEL] = f"{changes.pop('host', socket.gethostname())}:{changes.pop('pid')}"
    assert not changes
    return labels


@docker_test
def test_only_containers_of_runs_that_are_really_gone_are_removed(docker_client, base_image):
    host = socket.gethostname()
    containers = {
        "dead": owner(pid=str(dead_pid())),
        "pid reused by another process": owner(pid=str(os.getpid()), started="1"),
        "before a reboot": owner(pid=str(os.getpid()), boot="another-boot"),
        "labelled by an earlier version, dead": {OWNER_LABEL: f"{host}:{dead_pid()}"},
        "mine": process_owner(),
        "another host": owner(pid=str(dead_pid()), host=f"other-{host}"),
        "another PID namespace": owner(pid=str(dead_pid()), namespace="pid:[1]"),
    }
    started = {
        what: started_container(docker_client, base_image, labels)
        for what, labels in containers.items()
    }
    gone = {
        "dead",
        "pid reused by another process",
        "before a reboot",
        "labelled by an earlier version, dead",
    }
    try:
        removed = set(remove_stale_containers(docker_client))

        # Another run of the tool on this engine may remove a stale one first (every run does at
        # its start): what this call removed is stale, and afterwards every stale one is gone.
        assert {what for what, c in started.items() if c.name in removed} <= gone
        for what, container in started.items():
            if what in gone:
                with pytest.raises(docker.errors.NotFound):
                    docker_client.containers.get(container.id)
            else:
                docker_client.containers.get(container.id)
    finally:
        for container in started.values():
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def in_new_pid_namespace(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python `code` in a new PID namespace, as a containerised CI runner would."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        prefix.insert(1, "--map-root-user")
        prefix.insert(1, "--user")
    return subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )


@docker_test
def test_a_run_in_another_pid_namespace_keeps_this_runs_live_containers(docker_client, base_image):
    mine = started_container(docker_client, base_image, process_owner())
    try:
        other = in_new_pid_namespace(
            "import os\n"
            "from runner.execute import connect, process_owner, remove_stale_containers\n"
            "print(os.getpid(), process_owner())\n"
            "print('removed', remove_stale_containers(connect()))\n"
        )
        assert other.returncode == 0, other.stderr
        assert "removed" in other.stdout and mine.name not in other.stdout, other.stdout
        docker_client.containers.get(mine.id)  # still there
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            mine.remove(force=True)


@docker_test
def test_remove_own_containers_removes_only_this_process_containers(docker_client, base_image):
    mine = started_container(docker_client, base_image, process_owner())
    same_pid_elsewhere = started_container(
        docker_client, base_image, owner(pid=str(os.getpid()), namespace="pid:[1]")
    )
    try:
        remove_own_containers(docker_client)

        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(mine.id)
        docker_client.containers.get(same_pid_elsewhere.id)
    finally:
        for container in (mine, same_pid_elsewhere):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


# --- example runs ------------------------------------------------------------------------------


def test_an_example_container_is_isolated_and_laid_out_for_the_example(tmp_path):
    lib, run_dir, ptoas = tmp_path / "lib", tmp_path / "run", tmp_path / "ptoas"
    run = example(
        "cann:test",
        lib,
        run_dir,
        platform="a2a3",
        passthrough=Passthrough(
            devices=("/dev/null:/dev/davinci0:rwm",), environment={"ASCEND_X": "1"}
        ),
        extra_args=["--steps", "2"],
        environment={"PTO2_RING_HEAP": "1073741824", "PYTHONPATH": "/opt/extra"},
        ptoas_root=ptoas,
        cpus=2.0,
        memory="8g",
        owner=(1000, 1001),
    )

    spec = example_container(run)

    assert spec.image == "cann:test"
    assert spec.command[:2] == ["sh", "-c"]
    assert "chown -R 1000:1001 /bisect/run" in spec.command[2]
    assert spec.command[4:] == [
        "python3",
        f"{LIB_MOUNT}/{EXAMPLE_PATH}",
        *("-p", "a2a3", "-d", "0", "--steps", "2"),
    ]
    assert spec.mounts == [
        Mount(str(lib), LIB_MOUNT),
        Mount(str(run_dir), RUN_MOUNT, read_only=False),
        Mount(str(ptoas), str(ptoas)),
    ]
    assert spec.environment["PYTHONPATH"] == f"{LIB_MOUNT}:/opt/extra"
    assert spec.environment["PYPTO_PROG_BUILD_DIR"] == f"{RUN_MOUNT}/build_output"
    assert spec.environment["PTOAS_ROOT"] == str(ptoas)
    assert spec.environment["PTO2_RING_HEAP"] == "1073741824"
    assert spec.environment["ASCEND_X"] == "1"
    assert "PTO_ISA_ROOT" not in spec.environment
    assert spec.devices == ["/dev/null:/dev/davinci0:rwm"]
    assert spec.working_dir == RUN_MOUNT
    assert spec.cpus == 2.0
    assert spec.mem_limit == "8g"
    assert not spec.network
    assert not spec.privileged


def test_an_images_own_pythonpath_and_user_are_kept_around_the_lib_checkout(tmp_path):
    run = example("cann:test", tmp_path / "lib", tmp_path / "run", environment={"A": "1"})
    image = ImageDefaults(user="HwHiAiUser", python_path="/usr/local/Ascend/python")

    spec = example_container(run, image)

    assert spec.environment["PYTHONPATH"] == f"{LIB_MOUNT}:/usr/local/Ascend/python"
    assert spec.command[2].startswith("umask 0000; ")
    assert not example_container(run, ImageDefaults(user="0:0")).command[2].startswith("umask")
    assert example_container(run).environment["PYTHONPATH"] == LIB_MOUNT


@docker_test
def test_an_image_that_runs_as_another_user_writes_its_output_and_keeps_its_pythonpath(
    docker_client, base_image, tmp_path
):
    """CANN images may run as HwHiAiUser and set their Python paths with ENV: the example could
    not write build_output/ into the run directory, and lost the image's PYTHONPATH."""
    dockerfile = (
        f"FROM {base_image}\nRUN mkdir /opt/img && echo 'WHERE = 1' > /opt/img/img_helper.py\n"
        "ENV PYTHONPATH=/opt/img\nUSER nobody\n"
    )
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "Dockerfile").write_text(dockerfile)
    image, _ = docker_client.images.build(
        path=str(tmp_path / "image"), rm=True, labels={LABEL: "1"}
    )
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "check.py").write_text(
        "import os, img_helper\n"
        "os.makedirs('build_output/x', exist_ok=True)\n"
        "open('build_output/x/out.txt', 'w').write('written')\n"
        "print('[RUN] PASS', img_helper.WHERE)\n"
    )
    run = example(image.id, lib, tmp_path / "run")
    run.script = "check.py"
    try:
        result = run_example(docker_client, run)
    finally:
        docker_client.images.remove(image.id, force=True)

    assert result.exit_code == 0, result.output
    assert "[RUN] PASS 1" in result.output
    written = tmp_path / "run" / "build_output" / "x" / "out.txt"
    assert written.read_text() == "written"
    written.unlink()  # what the image's user wrote, the invoking user can remove
    (tmp_path / "run" / "build_output" / "x").rmdir()


@pytest.mark.parametrize("script", ["/abs/example.py", "../outside.py", ""])
def test_an_example_outside_the_lib_checkout_is_rejected(script, tmp_path):
    run = example("img", tmp_path, tmp_path / "run")
    run.script = script

    with pytest.raises(BadInput, match="inside the pypto-lib checkout"):
        example_container(run)


@docker_test
def test_a_simulator_example_leaves_its_log_and_generated_code_in_the_artifacts_dir(
    docker_client, base_image, lib_dir, tmp_path
):
    artifacts = tmp_path / "runs" / "r1"
    run = example(base_image, lib_dir, artifacts, owner=(4321, 4322))

    result = run_example(docker_client, run)

    assert result.exit_code == 0, result.output
    assert "[RUN] PASS" in result.output
    assert result.log_path == artifacts / "log.txt"
    assert "[RUN] PASS" in (artifacts / "log.txt").read_text()
    (generated,) = (artifacts / "build_output").glob("DecodeFwd_*")
    assert (generated / "kernels" / "aiv" / "DecodeFwd.cpp").is_file()
    assert (generated / "ptoas" / "DecodeFwd.pto").is_file()
    owners = {(path.stat().st_uid, path.stat().st_gid) for path in generated.rglob("*")}
    assert owners == {(4321, 4322)}


@docker_test
def test_the_example_exit_code_survives_the_wrapper(docker_client, base_image, tmp_path):
    lib = tmp_path / "lib"
    write_lib(lib)
    write_pypto(lib, revision=2, factor=1.01, uses_simpler=False)

    result = run_example(docker_client, example(base_image, lib, tmp_path / "run"))

    assert result.exit_code == 1
    assert "does not match golden" in result.output


@docker_test
def test_a_mapped_device_is_a_character_device_inside_the_container(
    docker_client, base_image, lib_dir, tmp_path
):
    host = tmp_path / "host"
    (host / "usr/local/Ascend/driver").mkdir(parents=True)
    (host / "usr/local/Ascend/driver/version.info").write_text("Version=24.1.0\n")
    devices = passthrough("explicit", "a2a3", ["0"], ["/dev/null:/dev/davinci0"], root=host)
    run = example(base_image, lib_dir, tmp_path / "run", platform="a2a3", passthrough=devices)
    run.extra_args = []
    run.python = "sh"
    run.script = "probe.sh"
    (lib_dir / "probe.sh").write_text(
        'cat /usr/local/Ascend/driver/version.info\npython3 "$(dirname "$0")/models/sample/'
        'decode_fwd.py" "$@"\n'
    )

    result = run_example(docker_client, run)

    assert result.exit_code == 0, result.output
    assert "Version=24.1.0" in result.output
    assert "/dev/davinci0 is a character device" in result.output
    assert "[RUN] PASS" in result.output


@docker_test
def test_without_passthrough_an_npu_example_cannot_initialise(
    docker_client, base_image, lib_dir, tmp_path
):
    run = example(base_image, lib_dir, tmp_path / "run", platform="a2a3")

    result = run_example(docker_client, run)

    assert result.exit_code == 3
    assert "aclInit failed" in result.output


@docker_test
def test_a_timed_out_example_still_hands_its_files_to_the_user(
    docker_client, base_image, lib_dir, tmp_path
):
    (lib_dir / "hang.py").write_text(
        "import pathlib, time\n"
        "pathlib.Path('partial.txt').write_text('half done')\n"
        "print('hanging', flush=True)\n"
        "time.sleep(60)\n"
    )
    artifacts = tmp_path / "run"
    run = example(base_image, lib_dir, artifacts, timeout=3, owner=(4321, 4322))
    run.script = "hang.py"

    result = run_example(docker_client, run)

    assert result.timed_out
    assert "hanging" in (artifacts / "log.txt").read_text()
    partial = artifacts / "partial.txt"
    assert partial.read_text() == "half done"
    assert (partial.stat().st_uid, partial.stat().st_gid) == (4321, 4322)


def test_a_missing_example_is_reported_before_any_container(tmp_path):
    run = example("img", tmp_path, tmp_path / "run")

    with pytest.raises(BadInput, match="not found in"):
        run_example(None, run)  # type: ignore[arg-type]
    assert not os.path.exists(tmp_path / "run")


@docker_test
def test_output_still_coming_after_the_exit_is_waited_for_not_cut(
    docker_client, base_image, tmp_path
):
    """The example exits long before the log stream has passed on all its output (a slow
    terminal echo here, a large log on a loaded engine in the field): judging the part read
    within a fixed grace made a passing run a skip."""
    seen: list[str] = []

    def slow_echo(line: str) -> None:
        seen.append(line)
        time.sleep(0.05)

    lines = 300  # 15 s of echo, beyond the 10 s grace
    spec = shell(base_image, f"seq 1 {lines}; echo '[RUN] PASS (0.1s)'")

    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt", echo=slow_echo)

    assert result.output.endswith(f"{lines}\n[RUN] PASS (0.1s)\n")
    assert (tmp_path / "log.txt").read_text() == result.output
    assert seen[-1] == "[RUN] PASS (0.1s)"


@docker_test
def test_a_progress_bar_of_megabytes_without_a_newline_is_kept_whole(
    docker_client, base_image, tmp_path
):
    bar = "python3 -c \"import sys; [sys.stdout.write('\\r%08d' % i) for i in range(1500000)]\""
    spec = shell(base_image, f"{bar}; echo; echo '[RUN] PASS (0.1s)'")

    result = run_container(docker_client, spec, log_path=tmp_path / "log.txt")

    assert len(result.output) == 1_500_000 * 9 + 1 + len("[RUN] PASS (0.1s)\n")
    assert result.output.endswith("\r01499999\n[RUN] PASS (0.1s)\n")
    assert (tmp_path / "log.txt").read_bytes().decode() == result.output
