"""Bad input through the real command line: one clear line, the documented exit code, no traceback,
and whatever a ledger already holds is left exactly as it was."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import docker
import docker.errors
import pytest
import requests
import tomllib

from runner.prepare import _script
from runner.sample.histories import Sample, SampleSpec
from runner.sample.packages import EXAMPLE_PATH
from tests.fixtures.cli import cli, run_args
from tests.fixtures.samples import SMALL


def assert_one_line_error(result, code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0]


def args_with(sample: Sample, tmp_path: Path, **changes: str) -> list[str]:
    args = run_args(sample, tmp_path / "work", tmp_path / "cache")
    for flag, value in changes.items():
        option = "--" + flag.replace("_", "-")
        if option in args:
            args[args.index(option) + 1] = value
        else:
            args += [option, value]
    return args


def test_run_without_a_pypto_checkout_says_which_flag_is_missing(tmp_path):
    assert_one_line_error(cli("run", "--workdir", str(tmp_path)), 2, "--pypto")


def test_a_directory_that_is_not_a_git_repository_is_refused(sample, tmp_path):
    result = cli(*args_with(sample, tmp_path, pypto=str(tmp_path)))
    assert_one_line_error(result, 2, "not a git repository")


def test_run_json_that_stops_without_a_report_answers_with_the_error_on_stdout(sample, tmp_path):
    """A job that parses `run --json` got an empty stdout when the run stopped on bad input or
    an infrastructure fault; it gets the one line said on stderr and the exit code."""
    result = cli(*args_with(sample, tmp_path, pypto=str(tmp_path)), "--json")

    assert_one_line_error(result, 2, "not a git repository")
    said = result.stderr.strip().removeprefix("error: ")
    assert result.json() == {"error": said, "exit_code": 2}


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("good", "no-such-tag", "no-such-tag"),
        ("script", "models/missing.py", "no such file"),
        ("script", "../outside.py", "inside --lib"),
        ("device", "zero", "device"),
        ("device", "0,1,0", "card 0 more than once"),
        ("device", "\u0661", "device must be a card number"),  # an Arabic-Indic one
        ("device", "01,1", "card 1 more than once"),
        ("cpus", "0.001", "cpus 0.001 is below the 0.01 CPUs a container can have"),
        ("platform", "a2 a3", "platform"),
        ("platform", "a2a3simm", "unknown platform 'a2a3simm'"),
        ("submodule_path", "nope", "--submodule-path nope: neither end of the range has"),
        ("cache_dir", "/proc/nope", "--cache-dir /proc/nope: cannot create it"),
        ("workdir", "/proc/nope", "--workdir /proc/nope: cannot create it"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(sample, tmp_path, flag, value, fragment):
    assert_one_line_error(cli(*args_with(sample, tmp_path, **{flag: value})), 2, fragment)


@pytest.mark.docker
def test_ascend_runtime_mode_on_an_engine_without_that_runtime_is_bad_input(sample, tmp_path):
    """Every container start failed ("unknown or invalid runtime name"), three tries, exit 4:
    the engine's runtimes are known before the first build."""
    args = args_with(sample, tmp_path, platform="a2a3", device_mode="ascend-runtime")
    assert_one_line_error(
        cli(*args), 2, "--device-mode ascend-runtime: the Docker Engine has no `ascend` runtime"
    )


@pytest.mark.skipif(os.path.exists("/dev/davinci0"), reason="this host has NPU card 0")
def test_privileged_mode_without_the_card_is_bad_input_before_any_build(sample, tmp_path):
    args = args_with(sample, tmp_path, platform="a2a3", device_mode="privileged")
    assert_one_line_error(cli(*args), 2, "NPU device /dev/davinci0 is missing on this host")
    assert not (tmp_path / "cache" / "wheels").exists() or not any(
        (tmp_path / "cache" / "wheels").iterdir()
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--simpler", "/no/such/clone"], "--simpler /no/such/clone: no such directory"),
        (
            ["--submodule-source", "runtime=/no/such/clone"],
            "--submodule-source runtime=/no/such/clone: no such directory",
        ),
    ],
)
def test_a_missing_submodule_clone_is_named_as_given(sample, tmp_path, extra, fragment):
    assert_one_line_error(cli(*args_with(sample, tmp_path), *extra), 2, fragment)


def test_a_missing_directory_from_the_config_file_or_environment_is_named_as_set(sample, tmp_path):
    config = tmp_path / "bisect-precision.toml"
    config.write_text('pto_isa_root = "/no/such/isa"\n')
    args = run_args(sample, tmp_path / "w", tmp_path / "c")
    from_file = cli(*args, "--config", str(config))
    assert_one_line_error(from_file, 2, "pto_isa_root", "/no/such/isa: no such directory")
    assert "--pto-isa-root" not in from_file.stderr
    from_env = cli(*args, env={"BISECT_PRECISION_PTOAS_ROOT": "/no/such/ptoas"})
    assert_one_line_error(
        from_env, 2, "BISECT_PRECISION_PTOAS_ROOT", "/no/such/ptoas: no such directory"
    )


def test_good_equal_to_bad_is_refused(sample, tmp_path):
    args = args_with(sample, tmp_path, good=sample.pypto_shas[-1])
    assert_one_line_error(cli(*args), 2, "same commit")


def test_good_newer_than_bad_is_refused(sample, tmp_path):
    args = [*args_with(sample, tmp_path, good=sample.pypto_shas[5]), "--bad", sample.pypto_shas[2]]
    assert_one_line_error(cli(*args), 2, "swap")


@pytest.mark.parametrize("flags", [["--frobnicate"], ["--cpus", "abc"], ["--timeout", "x"]])
def test_run_json_answers_on_stdout_when_its_flags_do_not_parse(tmp_path, flags):
    result = cli("run", "--workdir", str(tmp_path), *flags, "--json")

    assert_one_line_error(result, 2, "(see --help)")
    said = result.stderr.strip().removeprefix("error: ")
    assert result.json() == {"error": said, "exit_code": 2}


@pytest.mark.parametrize("command", [[], ["cache"], ["builder"]])
def test_a_missing_command_shows_the_help_on_stdout_and_one_line_of_error(command):
    result = cli(*command)

    assert_one_line_error(result, 2, "missing command")
    assert (
        result.stdout.startswith("Usage: bisect-precision-docker") and "Commands" in result.stdout
    )


def test_an_unknown_option_is_one_line(tmp_path):
    assert_one_line_error(cli("run", "--frobnicate"), 2, "--frobnicate")


def test_an_unknown_config_key_is_named(sample, tmp_path):
    config = tmp_path / "bisect-precision.toml"
    config.write_text('knwon_good = "abc"\n')
    result = cli(*run_args(sample, tmp_path / "w", tmp_path / "c"), "--config", str(config))
    assert_one_line_error(result, 2, "knwon_good")


def test_the_known_good_commit_can_come_from_the_config_file(sample, tmp_path):
    config = tmp_path / "bisect-precision.toml"
    config.write_text('known_good = "no-such-revision"\nplatform = "a2a3sim"\n')
    args = run_args(sample, tmp_path / "w", tmp_path / "c")
    at = args.index("--good")
    del args[at : at + 2]
    result = cli(*args, "--config", str(config))
    assert_one_line_error(result, 2, "no-such-revision")


@pytest.mark.docker
def test_a_missing_npu_device_is_an_error_before_anything_is_built(sample, tmp_path):
    args = run_args(sample, tmp_path / "w", tmp_path / "c")
    at = args.index("--device-map")
    del args[at : at + 2]
    args[args.index("--device") + 1] = "7"
    assert_one_line_error(cli(*args), 2, "/dev/davinci7")
    assert not (tmp_path / "c").exists()


@pytest.mark.docker
def test_a_base_image_missing_from_the_engine_is_named(sample, tmp_path, docker_client):
    result = cli(*args_with(sample, tmp_path, base_image="no-such-image:never"))
    assert_one_line_error(result, 2, "no-such-image:never")


@pytest.mark.docker
@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "--base-image is empty"),
        (" ", "--base-image is empty"),
        ("UPPER:tag", "--base-image 'UPPER:tag' is not an image name Docker accepts"),
        ("foo bar", "--base-image 'foo bar' is not an image name"),
        (":latest", "--base-image ':latest' is not an image name"),
    ],
)
def test_a_base_image_name_docker_cannot_take_is_bad_input(sample, tmp_path, name, fragment):
    """Not the engine's fault (they were exit 4, "the Docker Engine stopped answering")."""
    assert_one_line_error(cli(*args_with(sample, tmp_path, base_image=name)), 2, fragment)
    args = args_with(sample, tmp_path)
    at = args.index("--base-image")
    del args[at : at + 2]
    from_env = cli(*args, env={"BISECT_PRECISION_BASE_IMAGE": name})
    what = "is empty" if not name.strip() else f"{name!r} is not an image name"
    assert_one_line_error(from_env, 2, f"BISECT_PRECISION_BASE_IMAGE {what}")


def test_no_docker_engine_is_an_infrastructure_failure(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    assert_one_line_error(cli(*args_with(sample, tmp_path)), 4, "Docker Engine")


@pytest.mark.docker
@pytest.mark.parametrize(
    "content",
    ["{ not json", json.dumps({"tool": "another-tool", "attempts": []})],
    ids=["corrupt", "foreign"],
)
def test_a_corrupt_or_foreign_ledger_is_refused_and_left_untouched(
    sample, tmp_path, content, docker_client
):
    workdir = tmp_path / "work"
    workdir.mkdir()
    ledger = workdir / "ledger.json"
    ledger.write_text(content)
    result = cli(*args_with(sample, tmp_path))
    assert_one_line_error(result, 2, str(ledger))
    assert ledger.read_text() == content


@pytest.mark.parametrize("command", [["status"], ["report"], ["log"], ["reproduce", "001"]])
@pytest.mark.parametrize("text", ["{ not json", "[" * 100_000], ids=["cut", "nested"])
def test_a_corrupt_ledger_read_by_another_command_points_at_run_to_start_over(
    tmp_path, command, text
):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(text)

    result = cli(*command, "--workdir", str(tmp_path))

    assert_one_line_error(result, 2, "start over with `run ... --new-session`")
    assert ledger.read_text() == text


def test_an_example_linked_from_outside_the_lib_or_by_absolute_path_is_refused(sample, tmp_path):
    """The runs see a copy of --lib mounted elsewhere: such a link points at nothing there,
    and every test was recorded as a skip (exit 3)."""
    lib = tmp_path / "lib"
    shutil.copytree(sample.lib, lib, symlinks=True)
    outside = tmp_path / "example.py"
    outside.write_text("print('[RUN] PASS')\n")
    (lib / "out.py").symlink_to(outside)
    (lib / "abs.py").symlink_to(lib / EXAMPLE_PATH)
    (lib / "rel.py").symlink_to(EXAMPLE_PATH)

    for name, fragment in (("out.py", "outside --lib"), ("abs.py", "make the link relative")):
        result = cli(*args_with(sample, tmp_path, lib=str(lib), script=name))
        assert_one_line_error(result, 2, f"--script {name}: a link", fragment)
    assert not (tmp_path / "work" / "ledger.json").exists()
    assert _script(lib, "rel.py") == "rel.py"


def test_a_path_that_is_not_utf8_is_bad_input_before_a_workdir_is_made(sample, tmp_path):
    """A Latin-1 byte in a path reached the ledger's JSON and Docker's API: exit 4 with an
    unexpected UnicodeEncodeError, and a half-made workdir left behind."""
    workdir = os.fsdecode(bytes(tmp_path) + b"/w\xff")
    result = cli(*args_with(sample, tmp_path, workdir=workdir), "--json")

    assert_one_line_error(result, 2, "argument ", "/w\\xff is not valid UTF-8")
    assert result.json()["exit_code"] == 2
    assert not os.path.exists(workdir)

    cache = os.fsdecode(bytes(tmp_path) + b"/c\xe9")
    result = cli("status", "--workdir", str(tmp_path), env={"BISECT_PRECISION_CACHE": cache})
    assert_one_line_error(result, 2, "BISECT_PRECISION_CACHE=", "/c\\xe9 is not valid UTF-8")


@pytest.mark.docker
def test_a_file_where_the_workdir_keeps_a_folder_is_bad_input(sample, tmp_path):
    """A `runs` file in the workdir was an unexpected FileExistsError (exit 4, a machine
    fault to CI) once the first test started."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "runs").write_text("")
    result = cli(*args_with(sample, tmp_path))

    assert_one_line_error(result, 2, "runs is a file where the workdir keeps a folder")
    assert not (tmp_path / "work" / "ledger.json").exists()


@pytest.mark.parametrize("command", [["status"], ["report"], ["log"], ["reproduce", "001"]])
def test_a_workdir_that_is_a_file_is_named_as_such(tmp_path, command):
    (tmp_path / "w").write_text("")
    result = cli(*command, "--workdir", str(tmp_path / "w"))
    assert_one_line_error(result, 2, f"--workdir {tmp_path / 'w'} is a file, not a directory")


@pytest.mark.parametrize("command", ["status", "report"])
def test_a_mistyped_cache_dir_of_a_reading_command_is_refused_not_created(tmp_path, command):
    from runner.ledger import Ledger
    from tests.test_ledger import make_inputs

    with Ledger.open(tmp_path / "w" / "ledger.json", make_inputs(tmp_path), tool_version="0"):
        pass
    typo = tmp_path / "cahce"

    result = cli(command, "--workdir", str(tmp_path / "w"), "--cache-dir", str(typo))

    assert_one_line_error(result, 2, f"--cache-dir {typo}: no such directory")
    assert not typo.exists()


@pytest.mark.parametrize(
    ("flags", "advice"),
    [([], "add --images (containers"), (["--images", "--builders"], "without --builders")],
)
def test_cleanup_of_one_workdir_says_what_it_needs(tmp_path, flags, advice):
    result = cli("cleanup", *flags, "--workdir", str(tmp_path))
    assert_one_line_error(result, 2, "--workdir limits --images", advice)


def test_cleanup_of_a_workdir_a_run_holds_is_refused(tmp_path):
    from runner.ledger import Ledger
    from tests.test_ledger import make_inputs

    with Ledger.open(tmp_path / "w" / "ledger.json", make_inputs(tmp_path), tool_version="0"):
        result = cli("cleanup", "--images", "--workdir", str(tmp_path / "w"))
    assert_one_line_error(result, 2, "a run holds", "clean up after it ends")


def test_status_without_a_ledger_says_how_to_start(tmp_path):
    assert_one_line_error(cli("status", "--workdir", str(tmp_path)), 2, "run")


def test_cache_commands_on_an_empty_cache_and_a_bad_size(tmp_path):
    listed = cli("cache", "ls", "--cache-dir", str(tmp_path), "--json")
    assert listed.returncode == 0 and listed.json() == []
    pruned = cli("cache", "prune", "--cache-dir", str(tmp_path), "--max-size", "lots")
    assert_one_line_error(pruned, 2, "--max-size")


@pytest.mark.docker
def test_editing_the_example_between_runs_is_refused_instead_of_mixing_verdicts(
    sample, tmp_path, shared_cache
):
    lib = tmp_path / "lib"
    shutil.copytree(sample.lib, lib)
    args = run_args(sample, tmp_path / "work", shared_cache)
    args[args.index("--lib") + 1] = str(lib)
    first = cli(*args)
    assert first.returncode == 3, first.stderr  # the default sample never regresses
    ledger = tmp_path / "work" / "ledger.json"
    before = ledger.read_bytes()

    example = lib / sample.script
    example.write_text(example.read_text().replace("RTOL = 1e-5", "RTOL = 1e-2"))
    again = cli(*args)

    assert_one_line_error(again, 2, "example's text", "--new-session")
    assert ledger.read_bytes() == before


@pytest.mark.docker
def test_editing_a_pypto_lib_helper_between_runs_is_refused_too(sample, tmp_path, shared_cache):
    """Goldens and helpers the example imports change verdicts as much as the example does."""
    lib = tmp_path / "lib"
    shutil.copytree(sample.lib, lib)
    args = run_args(sample, tmp_path / "work", shared_cache)
    args[args.index("--lib") + 1] = str(lib)
    first = cli(*args)
    assert first.returncode == 3, first.stderr
    snapshots = list((tmp_path / "work" / "lib-snapshot").iterdir())
    assert len(snapshots) == 1 and (snapshots[0] / sample.script).is_file()

    (lib / "models" / "sample" / "__init__.py").write_text("GOLDEN_SCALE = 2.0\n")
    again = cli(*args)

    assert_one_line_error(again, 2, "pypto-lib files changed", "--new-session")


def _commands(group, path=()):
    """Every command path of the CLI, groups included, from click's own tree."""
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from _commands(command, (*path, name))


PYTHON_TYPES = re.compile(
    r"<[a-z_\[\], |]+>|\b(?:list|dict|tuple|set)\["
    r"|\b(?:str|int|float|bool|Path|NoneType|Optional|TEXT|INTEGER|FLOAT|BOOLEAN)\b"
)


def test_no_help_page_shows_a_python_type_name():
    from typer.main import get_command

    from runner.cli import app

    paths = list(_commands(get_command(app)))
    assert ("run",) in paths and ("cache", "prune") in paths
    for path in paths:
        result = cli(*path, "--help")
        assert result.returncode == 0, (path, result.stderr)
        found = PYTHON_TYPES.search(result.stdout)
        assert not found, f"`{' '.join(path)} --help` shows {found[0]!r}: give the option a metavar"


def test_every_setting_has_a_flag_on_run():
    from runner.config import Settings, flag_name

    page = cli("run", "--help").stdout
    for name in Settings.model_fields:
        for flag in flag_name(name).split("/"):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", page), (name, flag)


def test_shell_completion_is_on():
    # Typer guesses the user's shell from the process tree (under make or CI the parent is sh,
    # which it does not support); with detection off, the shell is named on the command line.
    shown = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--show-completion", "bash"],
        env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and "complete" in shown.stdout, shown.stderr
    completed = subprocess.run(
        [sys.executable, "-m", "runner.cli"],
        env={
            **os.environ,
            "_BISECT_PRECISION_DOCKER_COMPLETE": "complete_bash",
            "COMP_WORDS": "bisect-precision-docker run --device-mo",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.stdout.split() == ["--device-mode"]
    choices = subprocess.run(
        [sys.executable, "-m", "runner.cli"],
        env={
            **os.environ,
            "_BISECT_PRECISION_DOCKER_COMPLETE": "complete_bash",
            "COMP_WORDS": "bisect-precision-docker run --device-mode p",
            "COMP_CWORD": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert choices.stdout.split() == ["privileged"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--submodule-source", "runtime"], "--submodule-source 'runtime': give PATH=DIR"),
        (["--run-env", "=x"], "--run-env '=x': give KEY=VALUE"),
        (
            ["--submodule-source", "runtime=/a", "--submodule-source", "runtime=/b"],
            "--submodule-source runtime is given twice (/a and /b): give one",
        ),
        (
            ["--submodule-source", "runtime=/a", "--submodule-source", "./runtime/=/b"],
            "--submodule-source: two clones for the submodule at runtime (/a and /b)",
        ),
        (["--build-env", "CC=gcc", "--build-env", "CC=clang"], "--build-env CC is given twice"),
        (["--build-pin", "{nope"], "--build-pin '{nope}'"[:13]),
        (["--build-pin", '{"requirements": []}'], "--build-pin (build_pins.0.requirements)"),
        (["--infra-retries", "0"], "--infra-retries: infra_retries must be 1 or more"),
        (["--build-jobs", "99999999999999999999"], "--build-jobs: Input should be less than"),
        (["--build-jobs", "0"], "--build-jobs: Input should be greater than"),
    ],
)
def test_malformed_new_flags_are_one_line(tmp_path, args, fragment):
    result = cli("run", "--workdir", str(tmp_path), *args)
    assert_one_line_error(result, 2, fragment)


def test_a_setting_from_the_environment_is_validated_with_the_variable_named(tmp_path):
    env = {**os.environ, "BISECT_PRECISION_DEVICE_MODE": "root"}
    completed = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--workdir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("error: BISECT_PRECISION_DEVICE_MODE: ")
    assert len(completed.stderr.strip().splitlines()) == 1


def test_the_config_reference_command_prints_the_committed_reference(tmp_path):
    printed = cli("config-reference")
    assert printed.returncode == 0
    assert printed.stdout == (Path(__file__).parent.parent / "docs" / "config.md").read_text()


NEW_SESSION_SPEC = SampleSpec(
    pypto_commits=8,
    simpler_commits=6,
    runtime_added_at=2,
    runtime_initial=1,
    libbacktrace_url_change_at=3,
    nested_submodule_at=2,
    bumps=((4, 5), (6, 6)),
    simpler_regression_at=3,
    broken_pypto=frozenset({1}),
)


def referenced_files(ledger: Path) -> dict[str, str]:
    """Every file a ledger points at (run folders, logs), with a digest of its bytes."""
    document = json.loads(ledger.read_text())
    paths: set[Path] = set()
    for attempt in document["attempts"]:
        if attempt["artifacts_dir"]:
            paths |= {p for p in Path(attempt["artifacts_dir"]).rglob("*") if p.is_file()}
        if attempt["log_path"]:
            paths.add(Path(attempt["log_path"]))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_new_session_in_the_same_workdir_leaves_every_file_of_the_earlier_one_untouched(
    sample_factory, finished, tmp_path, shared_cache
):
    sample = sample_factory(NEW_SESSION_SPEC)
    workdir = tmp_path / "work"
    args = run_args(sample, workdir, shared_cache)
    first = finished(sample, to=workdir).result
    assert first.returncode == 0, first.stderr
    ledger = workdir / "ledger.json"
    before = ledger.read_bytes()
    evidence = referenced_files(ledger)
    assert len(evidence) > 10
    first_ids = {a["run_id"] for a in json.loads(before)["attempts"]}
    judged = [a for a in json.loads(before)["attempts"] if a["verdict"] != "skip"]
    assert cli("reproduce", judged[0]["run_id"], "--workdir", str(workdir)).returncode == 0
    assert (workdir / "reproductions").is_dir()
    first_report = (workdir / "report.json").read_bytes()
    settings = (workdir / "settings.json").read_bytes()

    # A new session that its input stops late (the image probed, after the ledger was moved
    # aside) leaves the earlier one as the workdir's: its ledger, settings and reports.
    refused = cli(*args, "--new-session", "--python", "nosuchpython")
    assert_one_line_error(refused, 2, "nosuchpython")
    assert ledger.read_bytes() == before
    assert (workdir / "settings.json").read_bytes() == settings
    assert (workdir / "report.json").read_bytes() == first_report
    assert (workdir / "reproductions").is_dir()
    assert not list(workdir.glob("*.bak")) and not (workdir / "sessions").exists()

    second = cli(*args, "--new-session", "--json")
    assert second.returncode == 0, second.stderr
    (backup,) = workdir.glob("ledger.json.*.bak")
    name = backup.name.split(".")[-2]
    assert not (workdir / "reproductions").exists(), "the earlier session's reproductions moved"
    # Its reports too, as they were: the workdir's never describe a session it no longer holds.
    assert (workdir / "sessions" / name / "report.json").read_bytes() == first_report
    assert (workdir / "sessions" / name / "reproductions" / "ledger.json").exists()
    for command in (
        ["status", "--session", name, "--json"],
        ["report", "--session", name, "--json"],
        ["log", "--session", name],
        ["status"],
        ["report"],
        ["log"],
    ):
        assert cli(*command, "--workdir", str(workdir)).returncode == 0, command

    again = cli("reproduce", judged[-1]["run_id"], "--workdir", str(workdir))
    assert again.returncode == 0, again.stderr  # found in the earlier session, and reproduced
    assert (workdir / "sessions" / name / "reproductions" / "ledger.json").exists()

    assert backup.read_bytes() == before
    assert referenced_files(backup) == evidence
    second_ids = {a["run_id"] for a in json.loads(ledger.read_text())["attempts"]}
    assert second_ids and not second_ids & first_ids
    earlier = cli("status", "--workdir", str(workdir), "--session", name, "--json").json()
    assert earlier["attempts"] == len(first_ids) and earlier["finished"]
    assert (workdir / "sessions" / name / "report.json").exists()
    assert (
        f"earlier sessions (--session NAME): {name}"
        in cli("status", "--workdir", str(workdir)).stdout
    )
    wrong = cli("status", "--workdir", str(workdir), "--session", "19990101T000000Z")
    assert_one_line_error(wrong, 2, "no earlier session", name)


@pytest.mark.docker
def test_status_of_a_session_stopped_in_the_simpler_level_says_the_first_is_judged_with_it(
    sample_factory, finished, tmp_path
):
    """Mid-way through the simpler level, the pypto level has no steps left, but its answer is
    the joint chain's, still short of the threshold: `status` said "done"."""
    sample = sample_factory(NEW_SESSION_SPEC)
    workdir = tmp_path / "work"
    assert finished(sample, to=workdir).result.returncode == 0
    path = workdir / "ledger.json"
    ledger = json.loads(path.read_text())
    first = next(i for i, a in enumerate(ledger["attempts"]) if a["level"] == "simpler")
    ledger["attempts"] = ledger["attempts"][: first + 1]  # stopped after its first test
    path.write_text(json.dumps(ledger))

    shown = cli("status", "--workdir", str(workdir))

    assert shown.returncode == 0, shown.stderr
    (pypto,) = [line for line in shown.stdout.splitlines() if line.startswith("pypto level:")]
    assert pypto.endswith("judged with the simpler level from here"), shown.stdout
    assert any(
        line.startswith("simpler level:") and "left" in line for line in shown.stdout.splitlines()
    ), shown.stdout


@pytest.mark.docker
def test_the_report_wall_time_is_the_sessions_and_shows_this_invocations_too(
    sample_factory, finished, tmp_path, shared_cache
):
    sample = sample_factory(NEW_SESSION_SPEC)
    args = run_args(sample, tmp_path / "work", shared_cache)
    first = finished(sample, to=tmp_path / "work").result.json()["stats"]
    again = cli(*args, "--json").json()["stats"]  # a resume with nothing left to do

    invocations = json.loads((tmp_path / "work" / "ledger.json").read_text())["invocations"]
    assert len(invocations) == 2
    assert (
        first["wall_s"]
        == first["invocation_s"]
        == pytest.approx(invocations[0]["wall_s"], abs=0.01)
    )
    assert again["invocation_s"] == pytest.approx(invocations[1]["wall_s"], abs=0.01)
    assert again["wall_s"] == pytest.approx(first["wall_s"] + again["invocation_s"], abs=0.02)
    shown = cli("report", "--workdir", str(tmp_path / "work"), "--json").json()["stats"]
    assert shown["wall_s"] == again["wall_s"] and shown["invocation_s"] is None


@pytest.mark.parametrize("flag", ["workdir", "cache_dir"])
def test_a_workdir_or_cache_dir_that_is_a_file_is_bad_input(sample, tmp_path, flag):
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    option = "--" + flag.replace("_", "-")
    for value, fragment in ((afile, f"{option} {afile} is a file"), (afile / "sub", str(afile))):
        result = cli(*args_with(sample, tmp_path, **{flag: str(value)}))
        assert_one_line_error(result, 2, fragment)
    assert afile.read_text() == "not a directory\n"


@pytest.mark.docker
def test_more_cpus_than_the_engine_has_is_bad_input_before_any_build(sample, tmp_path):
    result = cli(*args_with(sample, tmp_path), "--cpus", "4096")
    assert_one_line_error(result, 2, "--cpus 4096 is more than the")
    assert not (tmp_path / "cache" / "wheels").exists()


@pytest.mark.docker
def test_more_memory_than_the_engine_has_is_bad_input_before_any_build(sample, tmp_path):
    result = cli(*args_with(sample, tmp_path), "--memory", "4096g")
    assert_one_line_error(result, 2, "--memory 4096g is more than the")
    assert not (tmp_path / "cache" / "wheels").exists()


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("lots", "is not a size such as 8g or 512m"), ("1m", "below Docker's minimum of 6m")],
)
def test_a_memory_limit_docker_cannot_take_is_a_one_line_error(sample, tmp_path, value, fragment):
    result = cli(*args_with(sample, tmp_path), "--memory", value)
    assert_one_line_error(result, 2, fragment)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--max-size", "-5G"], "cannot be negative"),
        (["--max-size", "inf"], "cannot be negative or infinite"),
        (["--all", "--max-size", "1G"], "cannot go with --max-size"),
        (["--max-size", "0"], "--all"),
    ],
)
def test_cache_prune_refuses_sizes_that_would_empty_it_behind_the_all_rule(
    tmp_path, extra, fragment
):
    entry = tmp_path / "wheels" / "ab" / "keep-me"
    entry.mkdir(parents=True)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.cli",
            "cache",
            "prune",
            "--cache-dir",
            str(tmp_path),
            *extra,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(refused, 2, fragment)
    assert entry.exists()


def test_cache_commands_take_the_cache_dir_of_the_config_file_run_uses(tmp_path):
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    config = tmp_path / "bisect.toml"
    config.write_text(f'cache_dir = "{cache}"\n')
    listed = cli("cache", "ls", "--config", str(config))
    assert listed.returncode == 0 and f"in {cache / 'wheels'}" in listed.stdout
    pruned = cli("cache", "prune", "--config", str(config), "--all")
    assert pruned.returncode == 0 and "0.00 MB of wheels left" in pruned.stdout
    config.write_text("cache_dir = 3\n")
    assert_one_line_error(cli("cache", "ls", "--config", str(config)), 2, "cache_dir")


def test_cache_ls_of_a_cache_dir_that_is_not_there_is_a_typo_not_an_empty_cache(tmp_path):
    missing = tmp_path / "no" / "such"
    assert_one_line_error(cli("cache", "ls", "--cache-dir", str(missing)), 2, "no such directory")


def test_cache_prune_without_a_limit_needs_all_when_nobody_can_confirm(tmp_path):
    entry = tmp_path / "wheels" / "ab" / "keep-me"
    entry.mkdir(parents=True)
    refused = subprocess.run(
        [sys.executable, "-m", "runner.cli", "cache", "prune", "--cache-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(refused, 2, "--all")
    assert entry.exists()
    (tmp_path / "builders" / "wheels").mkdir(parents=True)
    (tmp_path / "builders" / "wheels" / "cmake.whl").write_bytes(b"x" * 3_000_000)
    emptied = cli("cache", "prune", "--cache-dir", str(tmp_path), "--all")
    assert emptied.returncode == 0
    assert "0.00 MB of wheels left" in emptied.stdout
    assert "build-tool downloads for builder images: 3.00 MB" in emptied.stdout


def test_cache_prune_without_a_limit_asks_at_a_terminal_and_no_keeps_everything(tmp_path):
    import pty

    entry = tmp_path / "wheels" / "ab" / "keep-me"
    entry.mkdir(parents=True)
    leader, follower = pty.openpty()
    with os.fdopen(leader, "wb", buffering=0) as terminal:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "cache", "prune", "--cache-dir", str(tmp_path)],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(follower)
        terminal.write(b"n\n")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert "remove all" in err and "nothing removed" in out
    assert entry.exists()


def as_environment(args: list[str]) -> dict[str, str]:
    """`run`'s flags as BISECT_PRECISION_* variables: lists as JSON, like a CI job sets them."""
    from typing import get_origin

    from runner.config import Settings, flag_name

    fields = {flag_name(name): name for name in Settings.model_fields}
    values: dict[str, list[str]] = {}
    pairs = iter(args[1:])
    for flag in pairs:
        values.setdefault(fields[flag], []).append(next(pairs))
    environment = {}
    for name, given in values.items():
        is_list = get_origin(Settings.model_fields[name].annotation) is list
        environment[f"BISECT_PRECISION_{name.upper()}"] = (
            json.dumps(given) if is_list else given[-1]
        )
    return environment


@pytest.mark.docker
def test_a_bisect_configured_only_through_the_environment_finds_the_same_culprit(
    sample_factory, finished, tmp_path, shared_cache
):
    sample = sample_factory(NEW_SESSION_SPEC)
    by_flags = finished(sample, to=tmp_path / "flags").result
    environment = as_environment(run_args(sample, tmp_path / "env", shared_cache))
    assert {"BISECT_PRECISION_DEVICE_MAP", "BISECT_PRECISION_KNOWN_GOOD"} <= set(environment)

    by_environment = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "--json"],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )

    assert by_environment.returncode == by_flags.returncode == 0, by_environment.stderr
    found, expected = json.loads(by_environment.stdout), by_flags.json()
    assert found["source"] == expected["source"] == "simpler"
    assert found["pypto"]["first_bad"] == expected["pypto"]["first_bad"]
    assert found["simpler"]["culprit"] == expected["simpler"]["culprit"]
    assert (tmp_path / "env" / "ledger.json").exists()


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--max-abs-diff", "-1", "greater than or equal to 0"),
        ("--max-rel-diff", "-0.5", "greater than or equal to 0"),
        ("--max-mismatch-ratio", "5", "less than or equal to 1"),
    ],
)
def test_rethreshold_limits_outside_their_range_are_refused(tmp_path, flag, value, fragment):
    result = cli("report", "--workdir", str(tmp_path), "--rethreshold", flag, value)
    assert_one_line_error(result, 2, flag, fragment)


def test_cards_per_test_on_the_simulator_is_refused(sample, tmp_path):
    args = args_with(sample, tmp_path, platform="a2a3sim")
    result = cli(*args, "--device", "0,1", "--cards-per-test", "2")
    assert_one_line_error(result, 2, "--cards-per-test 2: the simulator uses no cards")


@pytest.mark.parametrize("command", [["status"], ["report"], ["log"], ["reproduce", "001"]])
def test_the_commands_after_a_run_find_the_workdir_through_config(tmp_path, command):
    config = tmp_path / "elsewhere.toml"
    config.write_text('workdir = "sessions/w"\n')
    result = cli(*command, "--config", str(config), cwd=tmp_path / "..")
    assert result.returncode == 2 and str(tmp_path / "sessions" / "w") in result.stderr


def test_a_sha_with_several_attempts_says_which_one_export_takes(tmp_path):
    from runner.ledger import Ledger
    from tests.fixtures.attempts import recorded
    from tests.test_ledger import make_inputs

    culprit = "ab12" + "0" * 36
    workdir = tmp_path / "w"
    with Ledger.open(workdir / "ledger.json", make_inputs(tmp_path), tool_version="0.1.0") as led:
        for run_id in ("r1", "r2", "r3"):  # a re-tested boundary; none ran the example
            led.record(recorded(run_id, pypto=culprit, verdict="skip", reason="build failed"))

    result = cli("export", "ab12", "--to", str(tmp_path / "b"), "--workdir", str(workdir))

    assert result.returncode == 2
    first, *rest = result.stderr.strip().splitlines()
    assert first == (
        "pypto ab1200000000 has 3 recorded attempts; taking the latest, r3 (name another by its "
        "run id: r1, r2)"
    )
    assert rest[0].startswith("error: attempt r3 never ran the example")
    only = cli("export", "r2", "--to", str(tmp_path / "b"), "--workdir", str(workdir))
    assert "recorded attempts" not in only.stderr and "attempt r2 never ran" in only.stderr

    # One run of its own and two inside a bump (with other simpler commits): its own is taken,
    # and the others are named too.
    anchor = "cd34" + "0" * 36
    with Ledger.open(workdir / "ledger.json", make_inputs(tmp_path), tool_version="0.1.0") as led:
        led.record(recorded("s1", pypto=anchor, verdict="skip", reason="build failed"))
        for run_id, simpler in (("s2", "1" * 40), ("s3", "2" * 40)):
            led.record(recorded(run_id, pypto=anchor, simpler=simpler, level="simpler"))
    result = cli("export", "cd34", "--to", str(tmp_path / "b"), "--workdir", str(workdir))
    assert result.stderr.strip().splitlines()[0] == (
        "pypto cd3400000000 has 3 recorded attempts; taking its own (the pypto level's verdict), "
        "s1 (name another by its run id: s2, s3)"
    )
    # Two of its own, then runs inside a bump: the latest of its own, not of all (trial E saw
    # "taking the latest" for a run older than the simpler level's).
    with Ledger.open(workdir / "ledger.json", make_inputs(tmp_path), tool_version="0.1.0") as led:
        led.record(recorded("s4", pypto=anchor, verdict="skip", reason="build failed"))
        led.record(recorded("s5", pypto=anchor, simpler="3" * 40, level="simpler"))
    result = cli("export", "cd34", "--to", str(tmp_path / "b"), "--workdir", str(workdir))
    assert result.stderr.strip().splitlines()[0] == (
        "pypto cd3400000000 has 5 recorded attempts; taking the latest of its own (the pypto "
        "level's verdicts), s4 (name another by its run id: s1, s2, s3, s5)"
    )


def test_a_commit_skip_took_as_untestable_has_nothing_to_reproduce(tmp_path):
    """It was never built: `reproduce` built and ran it, and called the verdict changed (a
    commit skipped because its build hangs would hang). `export` refuses it too."""
    from runner.errors import USER_SKIP
    from runner.ledger import Ledger
    from tests.fixtures.attempts import recorded
    from tests.test_ledger import make_inputs

    workdir = tmp_path / "w"
    with Ledger.open(workdir / "ledger.json", make_inputs(tmp_path), tool_version="0.1.0") as led:
        led.record(recorded("001-ab12", pypto="ab12" + "0" * 36, verdict="skip", reason=USER_SKIP))

    assert_one_line_error(
        cli("reproduce", "1", "--workdir", str(workdir)),
        2,
        "attempt 001-ab12 is a commit --skip took as untestable",
    )


@pytest.mark.docker
def test_cleanup_of_one_workdir_removes_its_images_and_leaves_everything_else(
    sample_factory, tmp_path, docker_client
):
    from runner.execute import KIND_LABEL, LABEL
    from tests.fixtures.cli import BASE_IMAGE

    # A base of its own, so the images this run makes are its alone (test images are shared by
    # every run with the same wheels on the same base).
    repository = f"bisect-precision-cleanup-{os.getpid()}"
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nLABEL cleanup-test={os.getpid()}\n")
    base, _ = docker_client.images.build(path=str(context), tag=f"{repository}:base", rm=True)
    (context / "Dockerfile").write_text(
        f"FROM {base.id}\nLABEL {LABEL}=1 {KIND_LABEL}=test-image other={os.getpid()}\n"
    )
    other, _ = docker_client.images.build(path=str(context), tag=f"{repository}:other", rm=True)
    sample = sample_factory(SampleSpec(**SMALL, bumps=((4, 4),), pypto_regression_at=5))
    workdir = tmp_path / "work"
    args = run_args(sample, workdir, tmp_path / "cache", "--base-image", f"{repository}:base")
    # Examples long enough for the builds ahead to layer test images that no test may use.
    args += ["--run-env", "SAMPLE_RUN_SECONDS=3"]
    try:
        first = cli(*args)
        assert first.returncode == 0, first.stderr
        ledger = json.loads((workdir / "ledger.json").read_text())
        recorded = {a["image_id"] for a in ledger["attempts"] if a["image_id"]}
        assert ledger["ahead_images"], "images layered ahead are recorded too"
        recorded |= set(ledger["ahead_images"])
        made = {image.id for image in docker_client.images.list(filters={"label": f"{LABEL}=1"})}
        on_base = {
            i.id
            for i in docker_client.images.list(filters={"label": f"{LABEL}.base-image={base.id}"})
        }
        assert recorded and recorded <= made and on_base - recorded, "test images and layers"
        # `reproduce` layers an attempt's image again once it is gone: that image is the
        # workdir's too (its reproductions' ledger records it).
        tested = next(a for a in ledger["attempts"] if a["image_id"])
        docker_client.images.remove(tested["image_id"], force=True)
        again = cli("reproduce", tested["run_id"], "--workdir", str(workdir))
        assert again.returncode == 0, again.stderr
        repro = json.loads((workdir / "reproductions" / "ledger.json").read_text())
        (relayered,) = {a["image_id"] for a in repro["attempts"]}
        assert relayered and relayered != tested["image_id"]
        on_base = {
            i.id
            for i in docker_client.images.list(filters={"label": f"{LABEL}.base-image={base.id}"})
        }

        assert_one_line_error(
            cli("cleanup", "--workdir", str(workdir)), 2, "--workdir limits --images"
        )
        assert_one_line_error(
            cli("cleanup", "--images", "--workdir", str(tmp_path / "none")),
            2,
            "no such directory",
        )
        # A workdir whose run stopped before its first test (bad input) recorded nothing.
        (tmp_path / "stopped").mkdir()
        nothing = cli("cleanup", "--images", "--workdir", str(tmp_path / "stopped"))
        assert nothing.returncode == 0 and "and 0 images of" in nothing.stdout, nothing.stderr
        done = cli("cleanup", "--images", "--workdir", str(workdir))
        assert done.returncode == 0, done.stderr
        assert f"and {len(on_base)} images of {workdir}" in done.stdout
        left = {image.id for image in docker_client.images.list(filters={"label": f"{LABEL}=1"})}
        assert not left & on_base, "every test image and layer of the workdir is gone"
        # Another run's test image stays (only this test's own is checked: other users of the
        # engine may remove theirs meanwhile, and the count above says what cleanup removed).
        assert other.id in left and docker_client.images.get(base.id)
    finally:
        for name in (f"{repository}:other", f"{repository}:base"):
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                docker_client.images.remove(name, force=True)


def test_a_runtime_that_moves_to_another_path_within_the_range_stops_before_any_build(
    sample, tmp_path
):
    from runner.sample.histories import RUNTIME_PATH, git

    repo = tmp_path / "pypto"
    git(tmp_path, "clone", "-q", "--no-checkout", str(sample.mirrors["pypto"]), str(repo))
    git(repo, "read-tree", "HEAD")
    pinned = git(repo, "rev-parse", f"HEAD:{RUNTIME_PATH}")
    modules = git(repo, "show", "HEAD:.gitmodules").replace(
        f"path = {RUNTIME_PATH}", "path = third_party/runtime"
    )
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=repo,
        input=modules + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    git(repo, "rm", "-q", "--cached", RUNTIME_PATH)
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{pinned},third_party/runtime")
    git(repo, "update-index", "--cacheinfo", f"100644,{blob},.gitmodules")
    git(
        repo,
        "commit",
        "-q",
        "-m",
        "build: move the runtime to third_party/runtime",
        when=50 * 86_400,
    )
    moved = git(repo, "rev-parse", "HEAD")
    args = run_args(sample, tmp_path / "work", tmp_path / "cache")
    args[args.index("--pypto") + 1] = str(repo)
    args[args.index("--good") + 1] = sample.pypto_shas[4]

    for extra, (here, there) in {
        (): ("runtime", "third_party/runtime"),
        ("--submodule-path", "./runtime/"): ("runtime", "third_party/runtime"),
        ("--submodule-path", "third_party/runtime"): ("third_party/runtime", "runtime"),
    }.items():
        stopped = cli(*args, *extra)
        good_end, bad_end = ("good", "bad") if here == "runtime" else ("bad", "good")
        assert_one_line_error(
            stopped,
            2,
            f"it is at {here} at the known-{good_end} commit and at {there} at the known-"
            f"{bad_end} commit ({moved[:12]} moves it)",
            # the side before the move can be bisected; the move is the bad end itself
            f"(--good {sample.pypto_shas[4][:12]} --bad {sample.pypto_shas[-1][:12]} "
            f"--submodule-path runtime): when {sample.pypto_shas[-1][:12]} passes and "
            f"{moved[:12]} fails, {moved[:12]} itself brought the regression",
        )
    # A move that also bumps simpler: neither side holds that bump, and the error says so.
    bumped = next(sha for sha in reversed(sample.simpler_shas) if sha != pinned.strip())
    git(repo, "update-index", "--cacheinfo", f"160000,{bumped},third_party/runtime")
    git(repo, "commit", "-q", "--amend", "--no-edit", when=50 * 86_400)
    moved = git(repo, "rev-parse", "HEAD")
    assert_one_line_error(
        cli(*args),
        2,
        f"{moved[:12]} itself brought the regression; it also moves the pinned simpler "
        f"{pinned[:12]} -> {bumped[:12]}, which neither side bisects",
    )
    typo = cli(*args, "--submodule-path", "runtim")
    assert_one_line_error(
        typo, 2, "neither end of the range has a submodule there", "has: 3rdparty/libbacktrace"
    )
    # A range after the move: the default path names nothing, and every test would run without
    # simpler; the path .gitmodules gives the submodule "simpler" is the way on.
    git(repo, "commit", "-q", "--allow-empty", "-m", "docs: after the move", when=51 * 86_400)
    args[args.index("--good") + 1] = moved
    after = cli(*args)
    assert_one_line_error(
        after,
        2,
        "neither end of the range has a submodule at runtime (the default runtime path), but "
        "simpler is a submodule at third_party/runtime: pass --submodule-path third_party/runtime",
    )
    assert not (tmp_path / "work" / "ledger.json").exists()


@pytest.mark.parametrize(
    ("code", "exit_code", "fragment"),
    [
        (errno.ENOSPC, 4, "the disk is full (writing /w/report.json.tmp): free space"),
        (errno.EROFS, 2, "cannot write /w/report.json.tmp: Read-only file system; use a"),
        (errno.EACCES, 2, "cannot write /w/report.json.tmp: Permission denied; use a"),
    ],
)
def test_a_full_disk_or_a_read_only_workdir_is_one_line_with_its_exit_code(
    capsys, code, exit_code, fragment
):
    import typer

    from runner.cli import guarded

    with pytest.raises(typer.Exit) as stopped, guarded():
        raise OSError(code, os.strerror(code), "/w/report.json.tmp")

    assert stopped.value.exit_code == exit_code
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {fragment}") and "unexpected" not in line


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),  # a write that names no file
        requests.exceptions.ReadTimeout(
            "UnixHTTPConnectionPool(host='localhost', port=None): Read timed out. (read timeout=60)"
        ),
        requests.exceptions.ConnectionError(
            "('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))"
        ),
    ],
)
def test_a_full_disk_without_a_path_or_an_engine_gone_mid_run_is_one_line_exit_4(capsys, failure):
    import typer

    from runner.cli import guarded

    with pytest.raises(typer.Exit) as stopped, guarded():
        raise failure

    assert stopped.value.exit_code == 4
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "unexpected" not in line and "()" not in line and "(writing)" not in line, line
    assert line.startswith(("error: the disk is full: free", "error: the Docker Engine stopped")), (
        line
    )


@pytest.mark.parametrize("command", [["status"], ["report"], ["reproduce", "001"]])
def test_a_session_whose_checkout_moved_says_so_and_how_to_read_it(tmp_path, command):
    from runner.config import Settings
    from runner.ledger import Ledger
    from runner.workflow import _save_settings
    from tests.test_ledger import make_attempt, make_inputs, sha

    inputs = make_inputs(tmp_path)  # its pypto checkout is not there
    with Ledger.open(tmp_path / "w" / "ledger.json", inputs, tool_version="0") as ledger:
        ledger.record(make_attempt("001", sha("good")))
    _save_settings(tmp_path / "w", Settings(pypto=tmp_path / "pypto"))

    result = cli(*command, "--workdir", str(tmp_path / "w"))

    assert_one_line_error(
        result, 2, f"the session's pypto checkout {tmp_path / 'pypto'} is not there any more"
    )


def test_a_reader_that_goes_away_ends_the_command_quietly_with_141_not_1():
    """`... | head -1`: 1 means inconclusive here, so a closed pipe must not say it."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "config-reference"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=120)

    assert proc.returncode == 141, err
    assert err == b""


def _to(stdout: str, stderr: str, *command: str) -> tuple[int, str]:
    """Run the CLI with its streams on the given files; its exit code and what stderr got."""
    import subprocess
    import sys

    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "runner.cli", *command], stdout=out, stderr=err, timeout=120
        )
    return proc.returncode, Path(stderr).read_text() if stderr != "/dev/full" else ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_on_a_full_disk_is_infrastructure_exit_4_not_1_with_a_traceback(tmp_path):
    """`run > bisect.log 2>&1` on a disk that fills: stdout's writes failed with ENOSPC, which
    escaped as a traceback and exit 1 (inconclusive); a full stderr ended with 1 before the
    first test. Both are the disk, exit 4, said on stderr while it still takes it."""
    err = str(tmp_path / "err.txt")

    code, said = _to("/dev/full", err, "config-reference")
    assert code == 4, said
    assert said.strip() == (
        "error: the disk is full (writing the output to stdout): free space there, then run "
        "again; what the ledger holds is kept"
    )
    assert _to("/dev/full", err, "--version")[0] == 4
    # An error said on a full stderr: the disk, not the error nobody can read.
    assert _to(os.devnull, "/dev/full", "status", "--workdir", str(tmp_path / "none"))[0] == 4
    assert _to(os.devnull, err, "status", "--workdir", str(tmp_path / "none"))[0] == 2


def test_an_error_said_to_a_reader_that_went_away_ends_with_141_not_130():
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "status", "--workdir", "/nonexistent/w"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.close()

    assert proc.wait(timeout=120) == 141


def test_log_without_the_checkout_prints_the_recorded_commits_alone(tmp_path):
    """The checkout moved or is gone: nothing to check the ledger against, and the shas alone
    still replay (with the checkout there, `log` refuses what `status` refuses: test_e2e)."""
    from runner.ledger import Ledger
    from runner.search import Verdict
    from tests.test_ledger import make_attempt, make_inputs, sha

    with Ledger.open(
        tmp_path / "w" / "ledger.json", make_inputs(tmp_path), tool_version="0"
    ) as ledger:
        ledger.record(make_attempt("001", sha("one")))
        ledger.record(make_attempt("002", sha("two"), verdict=Verdict.BAD))
    assert not (tmp_path / "pypto").exists()

    result = cli("log", "--workdir", str(tmp_path / "w"))

    assert result.returncode == 0, result.stderr
    assert f"git bisect start '--first-parent' '{sha('bad')}' '{sha('good')}'" in result.stdout
    assert f"git bisect good {sha('one')}" in result.stdout
    assert f"git bisect bad {sha('two')}" in result.stdout


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("module", ["runner.cli", "runner.replay"])
def test_a_stop_while_the_command_line_still_imports_is_exit_130_without_traceback(stop, module):
    """Ctrl-C in the first half second printed the traceback of the import under way, and a
    CI cancel's SIGTERM then killed the process (143); a little later, in a command's own
    imports, it ended with 130 and said nothing."""
    child = textwrap.dedent(
        f"""
        import sys, time
        class Slow:  # holds an import of the command line until the signal comes
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    print("importing", flush=True)
                    time.sleep(60)
        sys.meta_path.insert(0, Slow())
        sys.argv = ["bisect-precision-docker", "status"]
        from runner.entry import main
        main()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "importing\n"
    process.send_signal(stop)
    _, err = process.communicate(timeout=30)

    assert (process.returncode, err) == (130, "interrupted\n")
    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert scripts["project"]["scripts"]["bisect-precision-docker"] == "runner.entry:main"
