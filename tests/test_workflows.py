"""The bisect workflow's job script: inputs in, a resumable session dir, exit codes as annotations.

The script is what `.github/workflows/bisect.yml` runs on the NPU runner; here it runs with the
files the runner would give it. Exit codes other than 2 are produced by a stand-in for the tool
(a bisect that ends in 3 or 4 on purpose would need a broken engine); exit 2 comes from the real
command line refusing a missing example.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / ".github" / "scripts" / "bisect-job.sh"

# Stands in for `bisect-precision-docker run`: prints what the tool prints for an exit code and,
# like the tool, writes report.md into --workdir when it gets that far.
STAND_IN = """\
import os, sys
args = sys.argv[1:]
workdir = args[args.index("--workdir") + 1]
code = int(os.environ["STAND_IN_EXIT"])
with open(os.path.join(workdir, "argv.txt"), "w") as handle:
    handle.write("\\n".join(args))
with open(os.path.join(workdir, "env.txt"), "w") as handle:
    handle.write(os.environ.get("BISECT_PRECISION_REPEAT", "unset"))
if code in (0, 1, 3):
    with open(os.path.join(workdir, "report.md"), "w") as handle:
        handle.write("# precision bisect report (exit %d)\\n" % code)
if code == 0:
    print("first bad pypto commit: abc123 feat: faster softmax")
if os.environ.get("STAND_IN_STDOUT"):
    print(os.environ["STAND_IN_STDOUT"])
if code in (2, 3, 4):
    print("error: " + os.environ["STAND_IN_MESSAGE"], file=sys.stderr)
sys.exit(code)
"""


@dataclass
class Job:
    returncode: int
    stdout: str
    outputs: dict[str, str]
    summary: str

    def workdir(self) -> Path:
        return Path(self.outputs["workdir"])


@pytest.fixture
def pypto(tmp_path: Path) -> Path:
    repo = tmp_path / "pypto"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, "first")
    return repo


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def run_job(tmp_path: Path, pypto: Path, *, exit_code: int | None = None, **inputs: str) -> Job:
    """Run the job script as the runner would; `exit_code` None runs the real tool."""
    output = tmp_path / f"output-{len(list(tmp_path.glob('output-*')))}"
    summary = output.with_suffix(".summary")
    output.touch()
    summary.touch()
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "PYPTO_REPOSITORY": "hw-native-sys/pypto",
        "LIB_REPOSITORY": "hw-native-sys/pypto-lib",
        "PYPTO_DIR": str(pypto),
        "LIB_DIR": str(tmp_path / "lib"),
        "GOOD": "v0.1",
        "BAD": "HEAD",
        "SCRIPT": "models/missing.py",
        "PLATFORM": "a2a3sim",
        "DEVICE": "0",
        "BASE_IMAGE": "bisect-precision-test-base:bookworm",
        "STATE_DIR": "~/state",
        "STAND_IN_MESSAGE": "the known-good commit 1234 fails too (bad: does not match golden)",
        **inputs,
    }
    if exit_code is None:
        env["TOOL"] = str(Path(sys.executable).with_name("bisect-precision-docker"))
    else:
        stand_in = tmp_path / "stand-in.py"
        stand_in.write_text(STAND_IN)
        tool = tmp_path / "tool"
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} {stand_in} "$@"\n')
        tool.chmod(0o755)
        env["TOOL"] = str(tool)
        env["STAND_IN_EXIT"] = str(exit_code)
    (tmp_path / "lib").mkdir(exist_ok=True)
    completed = subprocess.run(
        ["bash", str(JOB)], env=env, capture_output=True, text=True, timeout=300
    )
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return Job(completed.returncode, completed.stdout, outputs, summary.read_text())


def annotations(job: Job) -> list[str]:
    return [line for line in job.stdout.splitlines() if line.startswith(("::error", "::warn"))]


def test_a_found_culprit_succeeds_and_its_report_goes_to_the_job_summary(tmp_path, pypto):
    job = run_job(tmp_path, pypto, exit_code=0)

    assert job.returncode == 0, job.stdout
    assert job.outputs["exit-code"] == "0"
    assert "# precision bisect report (exit 0)" in job.summary
    assert annotations(job) == []
    assert "::notice title=bisect%3A culprit found::first bad pypto commit: abc123" in job.stdout


def test_an_inconclusive_bisect_succeeds_with_a_warning(tmp_path, pypto):
    job = run_job(tmp_path, pypto, exit_code=1)

    assert job.returncode == 0
    assert job.outputs["exit-code"] == "1"
    [warning] = annotations(job)
    assert warning.startswith("::warning title=bisect%3A inconclusive (exit 1)::")
    assert "untestable commits border the culprit" in warning
    assert "precision bisect report" in job.summary


def test_an_inconclusive_bisect_of_low_confidence_says_so_in_its_warning(tmp_path, pypto):
    note = "note: inconclusive: low confidence at the pypto level after 40 tests; candidates: a 60%"
    job = run_job(tmp_path, pypto, exit_code=1, STAND_IN_STDOUT=note)

    [warning] = annotations(job)
    assert "::inconclusive: low confidence at the pypto level after 40 tests" in warning
    assert "untestable commits" not in warning


@pytest.mark.parametrize("counts", ["1 pypto candidate", "1 pypto and 2 simpler candidates"])
def test_an_inconclusive_range_of_untestable_commits_is_named_in_its_warning(
    tmp_path, pypto, counts
):
    note = f"note: {counts} could not be tested: build failed: pypto (syntax error)"
    job = run_job(tmp_path, pypto, exit_code=1, STAND_IN_STDOUT=note)

    [warning] = annotations(job)
    assert f"::{counts} could not be tested: build failed: pypto" in warning, warning


def test_endpoints_that_do_not_reproduce_fail_with_the_tools_message(tmp_path, pypto):
    job = run_job(tmp_path, pypto, exit_code=3)

    assert job.returncode == 3
    [error] = annotations(job)
    assert error == (
        "::error title=bisect%3A the endpoints or the environment do not reproduce (exit 3)::"
        "the known-good commit 1234 fails too (bad: does not match golden)"
    )
    assert "infrastructure" not in job.outputs


def test_an_infrastructure_failure_fails_marked_as_such(tmp_path, pypto):
    job = run_job(
        tmp_path, pypto, exit_code=4, STAND_IN_MESSAGE="no Docker Engine answers (100% gone)"
    )

    assert job.returncode == 4
    assert job.outputs["infrastructure"] == "true"
    [error] = annotations(job)
    assert error == (
        "::error title=bisect%3A infrastructure failure (exit 4)::"
        "no Docker Engine answers (100%25 gone)"
    )
    assert "no report from this run" in job.summary


def test_bad_input_from_the_real_tool_fails_with_its_one_line_message(tmp_path, pypto):
    job = run_job(tmp_path, pypto)

    assert job.returncode == 2, job.stdout
    [error] = annotations(job)
    assert error.startswith("::error title=bisect%3A bad input (exit 2)::")
    assert "models/missing.py" in error
    assert "no report from this run" in job.summary


def test_a_rerun_with_the_same_inputs_resumes_in_the_same_persistent_workdir(tmp_path, pypto):
    first_head = _git(pypto, "rev-parse", "HEAD")
    first = run_job(tmp_path, pypto, exit_code=0)
    _commit(pypto, "a commit that lands between the two runs")

    again = run_job(tmp_path, pypto, exit_code=0)
    other_device = run_job(tmp_path, pypto, exit_code=0, DEVICE="1")
    repeated = run_job(tmp_path, pypto, exit_code=0, REPEAT="3")

    assert again.workdir() == first.workdir()
    assert first.workdir().is_relative_to(tmp_path / "home" / "state")
    argv = (again.workdir() / "argv.txt").read_text().splitlines()
    assert argv[argv.index("--bad") + 1] == first_head, "HEAD is resolved once per session"
    assert argv[argv.index("--cache-dir") + 1] == str(tmp_path / "home" / "state" / "cache")
    assert other_device.workdir() != first.workdir()
    assert repeated.workdir() not in (first.workdir(), other_device.workdir())
    assert (first.workdir() / "env.txt").read_text() == "unset"
    assert (repeated.workdir() / "env.txt").read_text() == "3"


def test_a_state_dir_inside_runner_temp_is_refused(tmp_path, pypto):
    job = run_job(tmp_path, pypto, exit_code=0, STATE_DIR=str(tmp_path / "runner-temp" / "s"))

    assert job.returncode == 2
    [error] = annotations(job)
    assert "RUNNER_TEMP" in error


def test_an_input_is_data_never_shell(tmp_path, pypto):
    marker = tmp_path / "pwned"
    job = run_job(tmp_path, pypto, exit_code=0, SCRIPT=f"x.py; touch {marker} #$(touch {marker})")

    assert job.returncode == 0
    assert not marker.exists()
    argv = (job.workdir() / "argv.txt").read_text().splitlines()
    assert argv[argv.index("--script") + 1] == f"x.py; touch {marker} #$(touch {marker})"


def test_jobs_sharing_a_card_wait_for_each_other_whatever_their_device_lists(tmp_path, pypto):
    locks = tmp_path / "home" / "state" / "locks"
    locks.mkdir(parents=True)
    # Another job holds card 1 (its DEVICE was "1"); this one asks for cards 0 and 1.
    held = tmp_path / "held"
    holder = subprocess.Popen(
        ["flock", str(locks / "device-1.lock"), "sh", "-c", f"touch {held}; sleep 2"]
    )
    try:
        deadline = time.monotonic() + 30
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        job = run_job(tmp_path, pypto, exit_code=0, DEVICE="0,1")
        assert holder.poll() is not None, "the job finished while the other held card 1"
    finally:
        holder.wait(timeout=30)
    assert job.returncode == 0, job.stdout
    assert "another bisect holds card 1" in job.stdout


def test_a_rerun_after_pypto_lib_moved_on_resumes_at_the_sessions_first_commit(tmp_path, pypto):
    lib = tmp_path / "lib"
    lib.mkdir()
    _git(lib, "init", "-q")
    first = _commit(lib, "goldens as the session started")
    assert run_job(tmp_path, pypto, exit_code=0).returncode == 0
    moved = _commit(lib, "an unrelated README change")

    again = run_job(tmp_path, pypto, exit_code=0)

    assert again.returncode == 0, again.stdout
    assert f"pypto-lib at {first}" in again.stdout
    assert _git(lib, "rev-parse", "HEAD") == first != moved


def test_an_edited_config_file_starts_a_session_of_its_own(tmp_path, pypto):
    """Also when it lives in pypto-lib, which a rerun would otherwise roll back unread."""
    lib = tmp_path / "lib"
    lib.mkdir()
    _git(lib, "init", "-q")
    config = lib / "bisect-precision.toml"
    config.write_text("timeout = 600\n")
    _git(lib, "add", "bisect-precision.toml")
    _commit(lib, "a config beside the example")
    first = run_job(tmp_path, pypto, exit_code=0, CONFIG=str(config))
    same = run_job(tmp_path, pypto, exit_code=0, CONFIG=str(config))

    config.write_text("timeout = 900\n")
    _git(lib, "commit", "-q", "-am", "a longer timeout")
    edited = _git(lib, "rev-parse", "HEAD")
    changed = run_job(tmp_path, pypto, exit_code=0, CONFIG=str(config))

    assert same.workdir() == first.workdir()
    assert changed.workdir() != first.workdir()
    assert "pypto-lib at" not in changed.stdout, "not rolled back to the first session's commit"
    assert _git(lib, "rev-parse", "HEAD") == edited and config.read_text() == "timeout = 900\n"


def test_a_new_session_starts_the_same_inputs_over_from_head(tmp_path, pypto):
    first_head = _git(pypto, "rev-parse", "HEAD")
    first = run_job(tmp_path, pypto, exit_code=0)
    newer = _commit(pypto, "a commit that lands after the first session")

    resumed = run_job(tmp_path, pypto, exit_code=0)
    resumed_argv = (resumed.workdir() / "argv.txt").read_text().splitlines()
    over = run_job(tmp_path, pypto, exit_code=0, NEW_SESSION="true")
    argv = (over.workdir() / "argv.txt").read_text().splitlines()

    assert over.workdir() == resumed.workdir() == first.workdir()
    assert "--new-session" not in resumed_argv
    assert resumed_argv[resumed_argv.index("--bad") + 1] == first_head
    assert "--new-session" in argv and argv[argv.index("--bad") + 1] == newer
