"""A clean-room bundle of one recorded attempt: everything needed to see its verdict again on a
machine that has Docker but neither this tool nor the repositories.

A verdict is handed to people who were not there (a compiler developer, a hardware team), so the
bundle carries the test image itself (saved with the Docker SDK, gzipped), the ledger entry, the
environment it ran in, the example and its pypto-lib files as they were, and a `run.sh` that runs
the same container the tool ran and judges the output with the tool's own rules: the verdict code
(`runner/verdict.py` and the pure modules it imports) is copied into the bundle, not rewritten.
"""

from __future__ import annotations

import ast
import contextlib
import gzip
import json
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors

import runner
from runner import __version__, gitcmd
from runner.containers import ContainerSpec
from runner.errors import BadInput, InfrastructureError
from runner.execute import (
    KIND_LABEL,
    LABEL,
    LIB_MOUNT,
    OWNER_LABEL,
    RUN_MOUNT,
    ExampleRun,
    example_container,
    image_defaults,
)
from runner.images import find_test_image, image_labels, image_tag
from runner.ledger import (
    Attempt,
    LedgerDocument,
    judged,
)
from runner.prepare import writable_directory
from runner.reproduce import find_recorded, session_prepared
from runner.verdict import Tolerance, VerdictPatterns
from runner.workflow import load_saved_settings, run_settings

BUNDLE_FORMAT = 1
IMAGE_FILE = "image.tar.gz"
# example_container writes the artifacts' owner into the container command; the bundle's user is
# only known when run.sh runs, so a placeholder owner is swapped for "$OWNER" there.
_PLACEHOLDER_OWNER = (2147480001, 2147480002)
_PLACEHOLDER = f"{_PLACEHOLDER_OWNER[0]}:{_PLACEHOLDER_OWNER[1]}"
# What an attempt records about how it was built (builder images, exact build tools).
_BUILD_FACTS = frozenset({"builders", "build_tools"})
_SKIP_LIB = frozenset({".git", "__pycache__", "build_output", ".pytest_cache"})


@dataclass(frozen=True)
class Bundle:
    directory: Path
    attempt: Attempt
    image_bytes: int


def _test_image(client: docker.DockerClient, attempt: Attempt, base_image_id: str) -> Any:
    """The attempt's test image, or an equal one: made from the same base and wheels (the
    image `reproduce` layers again when the recorded one was removed)."""
    if attempt.image_id:
        with contextlib.suppress(docker.errors.ImageNotFound):
            return client.images.get(attempt.image_id)
    if "pypto" in attempt.wheel_digests:
        labels = image_labels(
            base_image_id=base_image_id,
            pypto_sha=attempt.pypto_sha,
            pypto_wheel_sha256=attempt.wheel_digests["pypto"],
            simpler_sha=attempt.simpler_sha,
            simpler_wheel_sha256=attempt.wheel_digests.get("simpler"),
        )
        tag = image_tag(attempt.pypto_sha, attempt.simpler_sha, base_image_id)
        equal = find_test_image(client, labels, tag)
        if equal is not None:
            return client.images.get(equal)
    raise BadInput(
        f"the test image {(attempt.image_id or 'none')[:19]} of {attempt.run_id} is no longer in "
        "the Docker Engine; run `reproduce` to rebuild it, then export"
    )


def export_attempt(
    workdir: Path,
    run_id: str,
    destination: Path,
    session: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Bundle:
    """Write the bundle of attempt `run_id` of the session in `workdir` into `destination`
    (`note` hears which attempt a SHA took, see `find_recorded`)."""
    workdir = workdir.expanduser().resolve()
    recorded = find_recorded(workdir, run_id, session, note)
    document, attempt = recorded.document, recorded.attempt
    if attempt.image_id is None:
        raise BadInput(
            f"attempt {attempt.run_id} never ran the example ({attempt.verdict.value}: "
            f"{attempt.reason}); only an attempt with a test image can be exported"
        )
    destination = destination.expanduser().absolute()
    if destination.exists() and not destination.is_dir():
        raise BadInput(f"--to {destination} is a file; name a new directory")
    if destination.exists() and any(destination.iterdir()):
        raise BadInput(f"--to {destination} exists and is not empty; name a new directory")
    writable_directory(destination, "--to")

    inputs = document.inputs
    settings = load_saved_settings(workdir, recorded.settings).model_copy(
        update={
            "pypto": inputs.checkout(),
            "lib": Path(inputs.lib_repo),
            "known_good": inputs.good,
            "bad": inputs.bad,
            "workdir": workdir,  # where the session's snapshot is, wherever the workdir moved
        }
    )
    prepared = session_prepared(settings, inputs.settings_digest, "export")
    client = prepared.client
    image = _test_image(client, attempt, prepared.base_image_id)
    recorded_image = attempt.image_id
    # What the bundle runs and says: the image it saves (an equal one `reproduce` layered again,
    # when the recorded one is gone) and the verdict as the session's limits judge it.
    attempt = judged(attempt, settings.tolerance()).model_copy(update={"image_id": image.id})

    created = not destination.exists()
    try:  # a path writable on paper may still refuse a directory (/proc, a read-only mount)
        destination.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--to {destination}: cannot create it ({exc.strerror or exc})") from None
    try:
        run = run_settings(prepared)
        defaults = image_defaults(client, attempt.image_id)
        spec = example_container(
            ExampleRun(
                image=attempt.image_id,
                lib_dir=destination / "lib",
                script=run.script,
                platform=run.platform,
                device=run.device,
                artifacts_dir=destination / "out",
                passthrough=run.passthrough,
                extra_args=list(run.extra_args),
                python=run.python,
                environment=dict(run.environment),
                ptoas_root=run.ptoas_root,
                pto_isa_root=run.pto_isa_root,
                cpus=run.cpus,
                memory=run.memory,
                timeout=run.timeout,
                owner=_PLACEHOLDER_OWNER,
            ),
            defaults,
        )
        # The session's read-only snapshot is what the runs mounted; older sessions had none.
        _copy_lib(run.lib_dir if run.lib_dir.is_dir() else prepared.lib, destination / "lib")
        _copy_judge(destination / "judge")
        recorded_log = Path(attempt.log_path) if attempt.log_path else None
        if recorded_log is not None and recorded_log.is_file():
            shutil.copyfile(recorded_log, destination / "recorded-log.txt")
        verbatim = _recorded_entry(recorded.ledger, attempt.run_id)
        attempt_data = verbatim.get("attempt") or attempt.model_dump(mode="json")
        _write_json(destination / "attempt.json", attempt_data)
        _write_json(
            destination / "session.json",
            verbatim.get("inputs") or inputs.model_dump(mode="json"),
        )
        _write_json(
            destination / "environment.json",
            _fingerprint(client, image, attempt_data, document, settings.device_mode, spec),
        )
        _write_json(
            destination / "bundle.json",
            {
                **_bundle_facts(attempt, run.patterns, run, settings.tolerance() or Tolerance()),
                **({"recorded_image_id": recorded_image} if recorded_image != image.id else {}),
            },
        )
        run_sh = destination / "run.sh"
        run_sh.write_text(
            _run_script(attempt, spec, run.timeout, run.python, writable=defaults.non_root)
        )
        run_sh.chmod(0o755)
        (destination / "README.md").write_text(_readme(attempt, document, spec))
        size = _save_image(image, destination / IMAGE_FILE)
    except BaseException:
        if created:
            shutil.rmtree(destination, ignore_errors=True)
        else:  # it was empty: leave it empty
            for child in destination.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise
    return Bundle(destination, attempt, size)


def _recorded_entry(path: Path, run_id: str) -> dict[str, Any]:
    """The attempt and the session inputs exactly as the ledger file holds them (a newer tool
    would add its defaults to a re-serialised model)."""
    try:
        data = json.loads(path.read_text())
        [attempt] = [a for a in data["attempts"] if a.get("run_id") == run_id]
        return {"attempt": attempt, "inputs": data["inputs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save_image(image: Any, path: Path) -> int:
    """The image with all its layers, as `docker load` reads it (gzip included)."""
    try:
        with gzip.open(path, "wb", compresslevel=4) as out:
            for chunk in image.save(named=False):
                out.write(chunk)
    except (docker.errors.APIError, OSError) as exc:
        raise InfrastructureError(
            f"could not save image {image.id[:19]} to {path} ({exc}); check the free space there"
        ) from exc
    return path.stat().st_size


def _copy_lib(lib: Path, into: Path) -> None:
    """The pypto-lib files the example can import: git's view when it is a checkout (tracked and
    untracked, ignored files left out), else the whole tree without caches and build output."""
    listed = None
    if (lib / ".git").exists():  # not a directory inside some other repository's work tree
        listed = gitcmd.run(
            ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=lib
        )
    if listed is not None and listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            source = lib / name
            if not source.is_file() or _SKIP_LIB.intersection(PurePosixPath(name).parts):
                continue  # a deleted file, or a submodule directory
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    else:
        shutil.copytree(
            lib, into, symlinks=True, ignore=shutil.ignore_patterns(*_SKIP_LIB, "*.pyc")
        )
    into.mkdir(parents=True, exist_ok=True)


def _runner_imports(path: Path) -> tuple[set[str], set[str]]:
    """(runner modules, other top-level modules) that a module imports."""
    own: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            top, _, rest = name.partition(".")
            if top == "runner":
                module = rest.split(".")[0]
                if module and (Path(path).parent / f"{module}.py").is_file():
                    own.add(module)
            else:
                other.add(top)
    return own, other


def _copy_judge(into: Path) -> None:
    """runner/verdict.py and the runner modules it imports, plus the bundle's judge.py."""
    package = Path(runner.__file__).parent
    wanted, seen = ["verdict"], set()
    while wanted:
        module = wanted.pop()
        if module in seen:
            continue
        seen.add(module)
        own, other = _runner_imports(package / f"{module}.py")
        foreign = sorted(other - set(sys.stdlib_module_names) - {"__future__"})
        if foreign:
            raise InfrastructureError(
                f"runner/{module}.py imports {', '.join(foreign)}: the bundle's judge must run "
                "on the standard library alone"
            )
        wanted.extend(own - seen)
    (into / "runner").mkdir(parents=True)
    (into / "runner" / "__init__.py").write_text(
        f'"""The verdict rules of bisect-precision-docker {__version__}, copied unchanged."""\n'
        f'__version__ = "{__version__}"\n'
    )
    for module in sorted(seen):
        shutil.copyfile(package / f"{module}.py", into / "runner" / f"{module}.py")
    (into / "judge.py").write_text(_JUDGE)


def _bundle_facts(
    attempt: Attempt, patterns: VerdictPatterns, run: Any, tolerance: Tolerance
) -> dict[str, Any]:
    """The run's facts for judge.py: the session's limits too, so the bundle judges the output
    as the search did (the recorded verdict is the judged one)."""
    attempt = judged(attempt, tolerance)
    return {
        "format": BUNDLE_FORMAT,
        "tool_version": __version__,
        "run_id": attempt.run_id,
        "image_id": attempt.image_id,
        "timeout": run.timeout,
        "patterns": {"good": list(patterns.good), "bad": list(patterns.bad)},
        "limits": asdict(tolerance),
        "recorded": {
            "verdict": attempt.verdict.value,
            "reason": attempt.reason,
            "exit_code": attempt.exit_code,
        },
    }


def _fingerprint(
    client: docker.DockerClient,
    image: Any,
    attempt: dict[str, Any],
    document: LedgerDocument,
    device_mode: str,
    spec: ContainerSpec,
) -> dict[str, Any]:
    """What the verdict was made in: the recorded fingerprint when the attempt holds one, the base
    and test image ids, the engine, and the container's devices and environment."""
    recorded = {
        key: value
        for key, value in attempt.items()
        if "fingerprint" in key or "environment" in key or key in _BUILD_FACTS
    }
    try:
        engine = client.version()
    except docker.errors.APIError:
        engine = {}
    return {
        "recorded": recorded,
        "base_image": document.inputs.base_image,
        "base_image_id": document.inputs.base_image_id,
        "test_image_id": image.id,
        "test_image_created": image.attrs.get("Created"),
        "test_image_labels": image.labels,
        "pypto_sha": attempt["pypto_sha"],
        "simpler_sha": attempt["simpler_sha"],
        "wheel_digests": attempt["wheel_digests"],
        "platform": document.inputs.platform,
        "devices": list(spec.devices),
        "device_mode": device_mode,
        "privileged": spec.privileged,
        "runtime": spec.runtime,
        "container_environment": dict(spec.environment),
        "docker_engine": {
            key: engine.get(key) for key in ("Version", "ApiVersion", "Os", "Arch", "KernelVersion")
        },
    }


def _mount_source(container: str, host: str) -> str:
    """The mount's source field, quoted for the shell and for docker's comma-separated
    --mount value (a bundle in `/tmp/a,b` split its path at the comma)."""
    if container == LIB_MOUNT:
        return """'"source='"$HERE/lib"'"'"""
    if container == RUN_MOUNT:
        return """'"source='"$OUT"'"'"""
    return shlex.quote('"source=' + host.replace('"', '""') + '"')


def _docker_arguments(spec: ContainerSpec) -> list[str]:
    """`docker create` options equal to what execute.run_container gives the engine."""
    lines = [
        "--label " + shlex.quote(f"{LABEL}=1"),
        f'--label "{OWNER_LABEL}=$(uname -n):$$"',
    ]
    for name, value in sorted(spec.labels.items()):
        if name != KIND_LABEL:
            lines.append("--label " + shlex.quote(f"{name}={value}"))
    lines.append("--label " + shlex.quote(f"{KIND_LABEL}=bundle"))
    if not spec.network:
        lines.append("--network none")
    for name, value in spec.environment.items():
        lines.append("--env " + shlex.quote(f"{name}={value}"))
    for mount in spec.mounts:
        readonly = ",readonly" if mount.read_only else ""
        source = _mount_source(mount.container, mount.host)
        target = shlex.quote(f"target={mount.container}{readonly}")
        lines.append(f"--mount type=bind,{source},{target}")
    lines.extend("--device " + shlex.quote(device) for device in spec.devices)
    if spec.privileged:
        lines.append("--privileged")
    if spec.ipc_mode:
        lines.append("--ipc " + shlex.quote(spec.ipc_mode))
    if spec.runtime:
        lines.append("--runtime " + shlex.quote(spec.runtime))
    if spec.working_dir:
        lines.append("--workdir " + shlex.quote(spec.working_dir))
    if spec.cpus:
        lines.append(f"--cpus {spec.cpus:g}")
    if spec.mem_limit:
        lines.append("--memory " + shlex.quote(spec.mem_limit))
    if spec.user:
        lines.append("--user " + shlex.quote(spec.user))
    return lines


def _command(spec: ContainerSpec) -> list[str]:
    words = []
    for word in spec.command:
        if _PLACEHOLDER in word:
            head, tail = word.split(_PLACEHOLDER, 1)
            words.append(shlex.quote(head) + '"$OWNER"' + shlex.quote(tail))
        else:
            words.append(shlex.quote(word))
    if not any('"$OWNER"' in word for word in words):
        raise InfrastructureError(
            "the example command no longer hands its output to a named owner; update bundle.py"
        )
    return words


def _run_script(
    attempt: Attempt, spec: ContainerSpec, timeout: float | None, python: str, *, writable: bool
) -> str:
    """`writable`: the image runs as a user other than root, which writes build_output/ into the
    output directory as `run` lets it write into the run directory."""
    options = " \\\n    ".join(_docker_arguments(spec))
    command = " ".join(_command(spec))
    seconds = f"{timeout:g}" if timeout else ""
    label_args = f"--label {LABEL}=1 --label {KIND_LABEL}=bundle"
    return _RUN_SH.format(
        run_id=attempt.run_id,
        image=shlex.quote(attempt.image_id or ""),
        timeout=shlex.quote(seconds),
        python=shlex.quote(python),
        options=options,
        command=command,
        labels=label_args,
        owner_label=OWNER_LABEL,
        image_file=IMAGE_FILE,
        run_mount=RUN_MOUNT,
        writable=_WRITABLE_OUT if writable else "",
    )


def _readme(attempt: Attempt, document: LedgerDocument, spec: ContainerSpec) -> str:
    inputs = document.inputs
    simpler = attempt.simpler_sha or "none (no runtime gitlink)"
    devices = ", ".join(spec.devices) or "none"
    host_paths = [m.host for m in spec.mounts if m.container not in (LIB_MOUNT, RUN_MOUNT)]
    reason = f" ({attempt.reason})" if attempt.reason else ""
    return _README.format(
        run_id=attempt.run_id,
        verdict=attempt.verdict.value,
        reason=reason,
        pypto=attempt.pypto_sha,
        simpler=simpler,
        script=inputs.script,
        platform=inputs.platform,
        devices=devices,
        base_image=inputs.base_image,
        base_image_id=inputs.base_image_id,
        image_id=attempt.image_id,
        host_paths=", ".join(f"`{p}`" for p in host_paths) or "none",
        image_file=IMAGE_FILE,
    )


_WRITABLE_OUT = '\nchmod 777 "$OUT"  # the image runs as a user other than root: it writes here'

_RUN_SH = """\
#!/bin/sh
# Reproduce attempt {run_id} of a precision bisect without bisect-precision-docker or the
# repositories: load the test image, run the example exactly as the tool ran it (same devices,
# environment, device mode and command), judge the output with the tool's rules, and print the
# recorded and the new verdict.  Exit 0: the verdict reproduces; 1: it does not; 2: cannot run.
# BUNDLE_JUDGE=image judges inside the test image instead of with this machine's python3.
set -eu
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$HERE/out"
IMAGE={image}
TIMEOUT={timeout}
OWNER="$(id -u):$(id -g)"
NAME="bisect-precision-bundle-$$"

if ! docker version >/dev/null 2>&1; then
    echo "run.sh needs the docker CLI and a running Docker Engine it may use" >&2
    exit 2
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "loading the test image from {image_file}"
    docker load -i "$HERE/{image_file}" >/dev/null || {{ echo "docker load failed" >&2; exit 2; }}
fi

# Remove this script's containers; a busy engine can refuse a removal once, so try again.
cleanup() {{
    for c in "$NAME" "$NAME-chown" "$NAME-judge"; do
        tries=0
        while docker container inspect "$c" >/dev/null 2>&1; do
            docker rm -f "$c" >/dev/null 2>&1 && break
            tries=$((tries + 1))
            if [ "$tries" -ge 10 ]; then
                echo "could not remove container $c; remove it with: docker rm -f $c" >&2
                break
            fi
            sleep 1
        done
    done
}}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
rm -rf "$OUT"
mkdir -p "$OUT"{writable}

docker create --name "$NAME" \\
    {options} \\
    "$IMAGE" {command} >/dev/null || {{
    echo "docker could not create the container: a device or host path above is missing here?" >&2
    exit 2
}}
echo "running the example (output in out/log.txt)"
if [ -n "$TIMEOUT" ] && command -v timeout >/dev/null 2>&1; then
    timeout "$TIMEOUT" docker start -a "$NAME" 2>&1 | tee "$OUT/log.txt"
else
    docker start -a "$NAME" 2>&1 | tee "$OUT/log.txt"
fi
timed_out=0
if [ "$(docker inspect -f '{{{{.State.Running}}}}' "$NAME")" = true ]; then
    docker kill "$NAME" >/dev/null 2>&1 || true
    timed_out=1
    # The kill skipped the example's own chown: hand its files to this user.
    docker run --rm --name "$NAME-chown" --network none {labels} \\
        --label "{owner_label}=$(uname -n):$$" \\
        --mount type=bind,'"source='"$OUT"'"',target={run_mount} "$IMAGE" \\
        chown -R "$OWNER" {run_mount} >/dev/null 2>&1 || true
fi
exit_code="$(docker inspect -f '{{{{.State.ExitCode}}}}' "$NAME")"
oom="$(docker inspect -f '{{{{.State.OOMKilled}}}}' "$NAME")"
cleanup
if [ "$timed_out" = 1 ]; then exit_code=""; fi

status=0
if [ "${{BUNDLE_JUDGE:-host}}" != image ] && command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    python3 -B -I -S "$HERE/judge/judge.py" "$HERE/bundle.json" "$OUT/log.txt" \\
        "$exit_code" "$timed_out" "$oom" || status=$?
else
    docker run --rm --name "$NAME-judge" --network none {labels} \\
        --label "{owner_label}=$(uname -n):$$" \\
        --mount type=bind,'"source='"$HERE"'"',target=/bundle,readonly "$IMAGE" \\
        {python} -B -I -S /bundle/judge/judge.py /bundle/bundle.json /bundle/out/log.txt \\
        "$exit_code" "$timed_out" "$oom" || status=$?
fi
exit "$status"
"""

_JUDGE = '''\
"""Judge this bundle's run with bisect-precision-docker's own rules (runner/verdict.py, copied
here unchanged) and compare it with the recorded verdict.

Usage: judge.py BUNDLE_JSON LOG EXIT_CODE TIMED_OUT OOM_KILLED   (EXIT_CODE empty after a timeout)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner.verdict import Tolerance, VerdictPatterns, judge  # noqa: E402


def main(argv):
    facts_path, log_path, exit_code, timed_out, oom = argv
    facts = json.loads(Path(facts_path).read_text())
    patterns = VerdictPatterns(
        good=tuple(facts["patterns"]["good"]), bad=tuple(facts["patterns"]["bad"])
    )
    output = Path(log_path).read_text(encoding="utf-8", errors="replace")
    outcome = judge(
        int(exit_code) if exit_code else None,
        output,
        timed_out=timed_out == "1",
        oom_killed=oom == "true",
        timeout_s=facts["timeout"],
        patterns=patterns,
    )
    limits = Tolerance(**facts.get("limits", {}))
    verdict, reason = limits.judge(outcome.verdict, outcome.reason, outcome.metrics)
    recorded = facts["recorded"]
    print(f"recorded verdict: {recorded['verdict']} ({recorded['reason']}) [{facts['run_id']}]")
    print(f"new verdict:      {verdict.value} ({reason})")
    same = verdict.value == recorded["verdict"]
    print("the verdict reproduces" if same else "the verdict does NOT reproduce")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

_README = """\
# Precision verdict {run_id}: {verdict}

This directory reproduces one verdict of a `bisect-precision-docker` session on any Linux
machine with Docker, without the tool or the pypto, simpler and pypto-lib repositories.

- verdict: **{verdict}**{reason}
- pypto `{pypto}`, simpler `{simpler}`
- example `{script}` on platform `{platform}`; devices: {devices}
- base image `{base_image}` (`{base_image_id}`); test image `{image_id}`

## Run it

```sh
./run.sh
```

`run.sh` loads the test image from `{image_file}` when the engine lacks it, runs the example in
a container exactly as the bisect did (same command, environment, devices and device mode,
no network), writes the output to `out/log.txt` and the generated code to `out/build_output/`,
then prints the recorded and the new verdict. Exit status: 0 the verdict reproduces, 1 it does
not, 2 Docker is unavailable. The verdict is judged by `judge/` (the tool's own verdict rules,
Python 3.10 or later; without one on this machine, set `BUNDLE_JUDGE=image` or let `run.sh`
judge inside the test image).

Host paths the container needs besides this directory: {host_paths}. An NPU run needs the same
card numbers; edit the `--device` lines of `run.sh` to use another card.

## Contents

| file | what |
|---|---|
| `{image_file}` | the test image (pypto and simpler installed), `docker save` output, gzipped |
| `attempt.json` | the ledger entry of this attempt |
| `session.json` | the session's inputs (repositories, range, base image id) |
| `environment.json` | the environment fingerprint: images, engine, devices, container environment |
| `bundle.json` | what `judge/` needs: recorded verdict, verdict patterns, timeout |
| `lib/` | the pypto-lib files the example ran with |
| `recorded-log.txt` | the output of the recorded run |
"""
