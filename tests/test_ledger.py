"""The ledger: resumable, refuses what it cannot trust, and survives being killed mid-write."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import SOURCE_UNAVAILABLE, BadInput, LedgerError
from runner.ledger import (
    LEDGER_SCHEMA_VERSION,
    Attempt,
    Ledger,
    LedgerDocument,
    SessionInputs,
    claim_run_dir,
    earlier_session,
    earlier_sessions,
    session_copy,
    to_git_bisect_log,
)
from runner.search import Verdict

REPO_ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def sha(label: object) -> str:
    return hashlib.sha1(str(label).encode()).hexdigest()


def make_inputs(tmp_path: Path, **changes: object) -> SessionInputs:
    fields: dict[str, object] = {
        "pypto_repo": str(tmp_path / "pypto"),
        "lib_repo": str(tmp_path / "pypto-lib"),
        "script": "models/sample/decode_fwd.py",
        "good": sha("good"),
        "bad": sha("bad"),
        "platform": "a2a3sim",
        "devices": ["0"],
        "base_image": "bisect-precision-test-base:bookworm",
        "base_image_id": "sha256:" + hashlib.sha256(b"base").hexdigest(),
        "settings_digest": "sha256:settings-v1",
    }
    fields.update(changes)
    return SessionInputs.model_validate(fields)


def make_attempt(
    run_id: str,
    pypto_sha: str,
    simpler_sha: str | None = None,
    verdict: Verdict = Verdict.GOOD,
    level: str = "pypto",
    **extra: object,
) -> Attempt:
    fields: dict[str, object] = {
        "run_id": run_id,
        "level": level,
        "pypto_sha": pypto_sha,
        "simpler_sha": simpler_sha,
        "verdict": verdict,
        "reason": "[RUN] PASS" if verdict is Verdict.GOOD else "does not match golden",
        "exit_code": 0 if verdict is Verdict.GOOD else 1,
        "build_s": 41.5,
        "run_s": 3.25,
        "wheel_digests": {"pypto": "sha256:" + sha(pypto_sha)},
        "builds": {"pypto": "built", "simpler": "cached"},
        "metrics": {"mismatched": 0 if verdict is Verdict.GOOD else 1, "max_abs_diff": 0.5},
        "device": "0",
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=45),
    }
    fields.update(extra)
    return Attempt.model_validate(fields)


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "work" / "ledger.json"


@pytest.fixture
def inputs(tmp_path: Path) -> SessionInputs:
    return make_inputs(tmp_path)


def write_json(path: Path, data: object) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path.read_bytes()


def stray_temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def run_python(script: str, *args: str, **popen: object) -> subprocess.Popen[str]:
    """Start a real second process that uses the ledger, as another run of the tool would."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        **popen,  # type: ignore[arg-type]
    )


# --- round trip and reuse ---------------------------------------------------------------------


def test_a_resumed_session_sees_every_recorded_attempt(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    first = make_attempt("run-0001", sha(3), sha("s1"), Verdict.GOOD)
    second = make_attempt("run-0002", sha(5), sha("s2"), Verdict.BAD, exit_code=1)

    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        assert ledger.path == ledger_path
        assert ledger.document.attempts == []
        ledger.record(first)
        ledger.record(second)

    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as resumed:
        assert resumed.document.attempts == [first, second]
        assert resumed.document.inputs == inputs
    assert Ledger.read(ledger_path).attempts == [first, second]

    text = ledger_path.read_text()
    assert text.startswith('{\n  "tool": "bisect-precision-docker",\n  "schema_version": 1,')
    assert text.endswith("}\n")
    assert json.loads(text)["attempts"][1]["verdict"] == "bad"


def test_a_verdict_is_reused_only_for_the_exact_pypto_simpler_pair(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(7), sha("s-old"), Verdict.BAD))
        ledger.record(make_attempt("r2", sha(7), None, Verdict.GOOD))
        ledger.record(make_attempt("r3", sha(7), sha("s-old"), Verdict.SKIP))

    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        latest = ledger.find(sha(7), sha("s-old"))
        assert latest is not None
        assert (latest.run_id, latest.verdict) == ("r3", Verdict.SKIP)
        pre_submodule = ledger.find(sha(7), None)
        assert pre_submodule is not None and pre_submodule.run_id == "r2"
        assert ledger.find(sha(7), sha("s-new")) is None
        assert ledger.find(sha(8), None) is None


def test_a_superseded_skip_stays_in_the_file_but_no_longer_counts(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    lacked = "source unavailable: submodule runtime commit 0123 is not in the local checkout"
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(7), sha("s"), Verdict.SKIP, reason=lacked))
        ledger.record(make_attempt("r2", sha(8), sha("s"), Verdict.SKIP, reason="build failed"))
        assert [a.run_id for a in ledger.document.skips(SOURCE_UNAVAILABLE)] == ["r1"]
        with pytest.raises(LedgerError, match="lacks: nope"):
            ledger.supersede(["r1", "nope"])
        assert ledger.document.superseded == []
        ledger.supersede(["r1"])

    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as resumed:
        doc = resumed.document
        assert [a.run_id for a in doc.attempts] == ["r1", "r2"]
        assert doc.superseded == ["r1"]
        assert doc.find_all(sha(7), sha("s")) == [] and resumed.find(sha(7), sha("s")) is None
        assert doc.skips(SOURCE_UNAVAILABLE) == []
        resumed.record(make_attempt("r3", sha(7), sha("s"), Verdict.GOOD))
        assert [a.run_id for a in resumed.document.find_all(sha(7), sha("s"))] == ["r3"]


def test_attempts_are_listed_per_level_in_recorded_order(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("p1", sha(1), sha("s"), level="pypto"))
        ledger.record(make_attempt("s1", sha(9), sha("s1"), level="simpler"))
        ledger.record(make_attempt("x1", sha(9), sha("s"), level="split"))
        ledger.record(make_attempt("p2", sha(2), sha("s"), level="pypto"))
        assert [a.run_id for a in ledger.attempts_for("pypto")] == ["p1", "p2"]
        assert [a.run_id for a in ledger.attempts_for("simpler")] == ["s1"]
        assert [a.run_id for a in ledger.attempts_for("split")] == ["x1"]


def test_a_newer_tool_version_resumes_an_older_ledger(
    tmp_path: Path, inputs: SessionInputs
) -> None:
    path = tmp_path / "ledger.json"
    with Ledger.open(path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    with Ledger.open(path, inputs, tool_version="0.2.0") as ledger:
        assert ledger.document.tool_version == "0.1.0"
        assert [a.run_id for a in ledger.document.attempts] == ["r1"]


def test_a_metric_of_nan_or_infinity_survives_the_round_trip(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    metrics = {"max_abs_diff": float("nan"), "ratio": float("inf"), "count": 3, "cmp": "ratio"}
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1), verdict=Verdict.BAD, metrics=metrics))
    read = Ledger.read(ledger_path).attempts[0].metrics
    assert read["max_abs_diff"] != read["max_abs_diff"]
    assert read["ratio"] == float("inf")
    assert read["count"] == 3 and type(read["count"]) is int
    assert read["cmp"] == "ratio"


# --- what is refused --------------------------------------------------------------------------


HOLD_LOCK = """
import sys
from pathlib import Path
from runner.ledger import Ledger, SessionInputs
inputs = SessionInputs.model_validate_json(sys.argv[2])
with Ledger.open(Path(sys.argv[1]), inputs, tool_version="holder"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_second_run_is_refused_while_another_process_holds_the_ledger(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    holder = run_python(
        HOLD_LOCK, str(ledger_path), inputs.model_dump_json(), stdin=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "locked\n"
        lock = f"{ledger_path}.lock"
        with pytest.raises(LedgerError) as refused:
            Ledger.open(ledger_path, inputs, tool_version="0.1.0")
        assert str(refused.value) == (
            f"ledger {ledger_path} is in use by another run (lock {lock}); "
            "wait for it or use another --workdir"
        )
        # status and report read without the lock while the run goes on
        assert Ledger.read(ledger_path).tool_version == "holder"
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0
    finally:
        holder.kill()
        holder.wait()
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        assert ledger.document.tool_version == "holder"


def test_a_closed_ledger_releases_its_lock_and_records_nothing(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    ledger = Ledger.open(ledger_path, inputs, tool_version="0.1.0")
    ledger.close()
    with pytest.raises(LedgerError, match="is closed"):
        ledger.record(make_attempt("late", sha(1)))
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as again:
        assert again.document.attempts == []


def test_a_file_that_is_not_json_is_refused_and_left_untouched(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    ledger_path.parent.mkdir(parents=True)
    ledger_path.write_bytes(b'{"tool": "bisect-precision-docker", "attem')
    before = ledger_path.read_bytes()
    with pytest.raises(LedgerError, match=r"is not valid JSON.*left untouched"):
        Ledger.open(ledger_path, inputs, tool_version="0.1.0")
    with pytest.raises(LedgerError, match=r"is not valid JSON"):
        Ledger.read(ledger_path)
    assert ledger_path.read_bytes() == before
    # the refusal released the lock, and --new-session sets the damaged file aside as it was
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0", new_session=True) as ledger:
        assert ledger.document.attempts == []
    # kept as it was, but as no earlier session: status, report, reproduce and cleanup of
    # the workdir read every earlier session, and each stopped on it
    (backup,) = ledger_path.parent.glob("ledger.json.*.damaged")
    assert backup.read_bytes() == before
    assert earlier_sessions(ledger_path) == {}
    # an earlier session's copy damaged later: nothing to start over, only a copy to drop
    copy = ledger_path.with_name("ledger.json.20250101T000000Z.bak")
    copy.write_bytes(before)
    with pytest.raises(LedgerError) as raised:
        Ledger.read(copy)
    assert "earlier session's copy, which no run writes" in str(raised.value)
    assert "--new-session" not in str(raised.value)


def test_another_tools_json_is_refused_and_left_untouched(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    before = write_json(ledger_path, {"tool": "git-bayesect", "schema_version": 1, "log": []})
    with pytest.raises(LedgerError, match=r"not a bisect-precision-docker ledger.*git-bayesect"):
        Ledger.open(ledger_path, inputs, tool_version="0.1.0")
    assert ledger_path.read_bytes() == before

    before = write_json(ledger_path, [1, 2, 3])
    with pytest.raises(LedgerError, match=r"no 'tool' field.*left untouched"):
        Ledger.read(ledger_path)
    assert ledger_path.read_bytes() == before


def test_a_ledger_from_a_newer_schema_is_refused_with_an_upgrade_hint(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    data = json.loads(ledger_path.read_text())
    data["schema_version"] = LEDGER_SCHEMA_VERSION + 1
    data["attempts"][0]["confidence"] = 0.99
    before = write_json(ledger_path, data)
    with pytest.raises(LedgerError, match=r"schema version 2, newer.*upgrade"):
        Ledger.open(ledger_path, inputs, tool_version="0.1.0")
    assert ledger_path.read_bytes() == before


def test_a_damaged_ledger_names_the_bad_field(ledger_path: Path, inputs: SessionInputs) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    data = json.loads(ledger_path.read_text())
    data["attempts"][0]["verdict"] = "maybe"
    before = write_json(ledger_path, data)
    with pytest.raises(LedgerError, match=r"damaged \(attempts\.0\.verdict: .*left untouched"):
        Ledger.open(ledger_path, inputs, tool_version="0.1.0")
    assert ledger_path.read_bytes() == before


def test_a_ledger_for_other_inputs_is_refused_naming_what_differs(
    tmp_path: Path, ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    before = ledger_path.read_bytes()
    other = make_inputs(tmp_path, bad=sha("other-bad"), settings_digest="sha256:settings-v2")
    with pytest.raises(LedgerError) as refused:
        Ledger.open(ledger_path, other, tool_version="0.1.0")
    message = str(refused.value)
    assert "bad: " in message and sha("other-bad") in message
    assert "settings_digest (build/run settings, the example's text or its pypto-lib" in message
    assert "or what --ptoas-root or --pto-isa-root hold did" in message
    assert "'sha256:settings-v1' -> 'sha256:settings-v2'" in message
    assert "platform" not in message and "good:" not in message
    assert "pass --new-session to start over (the old ledger is kept as a backup)" in message
    assert "to go on with it" not in message  # not the bad commit alone
    assert ledger_path.read_bytes() == before

    # A commit in the checkout moved HEAD, the default --bad: the session can go on.
    moved = make_inputs(tmp_path, bad=sha("new-head"))
    with pytest.raises(LedgerError) as refused:
        Ledger.open(ledger_path, moved, tool_version="0.1.0")
    assert f"; to go on with it, pass --bad {inputs.bad[:12]}; pass --new-session" in str(
        refused.value
    )
    assert ledger_path.read_bytes() == before


def test_a_new_session_keeps_the_old_ledger_as_a_byte_identical_backup(
    tmp_path: Path, ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    first_old = ledger_path.read_bytes()
    other = make_inputs(tmp_path, platform="a5sim")

    with Ledger.open(ledger_path, other, tool_version="0.1.0", new_session=True) as ledger:
        assert ledger.document.inputs == other
        assert ledger.document.attempts == []
        ledger.record(make_attempt("r2", sha(2)))
    second_old = ledger_path.read_bytes()
    # a second new session within the same second must not clobber the first backup
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0", new_session=True) as ledger:
        assert ledger.document.attempts == []

    backups = sorted(ledger_path.parent.glob("ledger.json.*.bak"), key=lambda p: p.stat().st_mtime)
    assert len(backups) == 2
    assert sorted(p.read_bytes() for p in backups) == sorted([first_old, second_old])
    for backup in backups:
        stamp = backup.name.removeprefix("ledger.json.").removesuffix(".bak").split("-")[0]
        assert datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    assert Ledger.read(ledger_path).inputs == inputs


def test_a_duplicate_run_id_or_an_invalid_attempt_is_refused_and_the_file_kept(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
        before = ledger_path.read_bytes()
        with pytest.raises(LedgerError, match="'r1' is already in the ledger"):
            ledger.record(make_attempt("r1", sha(2)))
        mutated = make_attempt("r2", sha(2))
        mutated.verdict = "probably-bad"  # type: ignore[assignment]
        with pytest.raises(LedgerError, match="refusing to record run 'r2'"):
            ledger.record(mutated)
        assert ledger_path.read_bytes() == before
        assert [a.run_id for a in ledger.document.attempts] == ["r1"]
    assert [a.run_id for a in Ledger.read(ledger_path).attempts] == ["r1"]


def test_a_missing_ledger_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=r"no ledger at .*start a bisect"):
        Ledger.read(tmp_path / "nowhere" / "ledger.json")


FILL_THE_DISK = """
import resource, sys
from pathlib import Path
from runner.errors import InfrastructureError
from runner.ledger import Attempt, Ledger, SessionInputs
path = Path(sys.argv[1])
inputs = SessionInputs.model_validate_json(sys.argv[2])
attempt = Attempt.model_validate_json(sys.argv[3])
with Ledger.open(path, inputs, tool_version="0.1.0") as ledger:
    # files may not grow past the current ledger: the next write hits EFBIG like a full disk
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 64, hard))
    try:
        ledger.record(attempt)
    except InfrastructureError as exc:
        print(len(ledger.document.attempts), exc)
"""


def test_a_failed_write_keeps_the_previous_ledger_and_says_why(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", sha(1)))
    before = ledger_path.read_bytes()
    big = make_attempt("r2", sha(2), reason="x" * 4096)
    child = run_python(
        FILL_THE_DISK, str(ledger_path), inputs.model_dump_json(), big.model_dump_json()
    )
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    assert out.startswith(f"1 cannot write the ledger {ledger_path}: File too large (EFBIG)")
    assert "the previous ledger is intact" in out
    assert ledger_path.read_bytes() == before
    assert stray_temp_files(ledger_path.parent) == []


# --- crash safety -----------------------------------------------------------------------------


RECORD_FOREVER = """
import itertools, sys
from pathlib import Path
from runner.ledger import Attempt, Ledger, SessionInputs
path, generation = Path(sys.argv[1]), sys.argv[2]
inputs = SessionInputs.model_validate_json(sys.argv[3])
template = Attempt.model_validate_json(sys.argv[4])
with Ledger.open(path, inputs, tool_version="0.1.0") as ledger:
    print("open", flush=True)
    for i in itertools.count():
        run_id = f"g{generation}-{i}"
        ledger.record(template.model_copy(update={"run_id": run_id, "metrics": {"i": i}}))
        print(run_id, flush=True)
"""


@dataclass
class Generation:
    """One writer process: the run ids it reported, and what the ledger held after its death."""

    number: int
    reported: list[str]
    recorded: list[str]


@pytest.mark.timeout(90)
def test_killing_the_writer_at_random_moments_never_loses_or_tears_a_record(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    rng = random.Random(20250301)
    template = make_attempt("template", sha(4), sha("s"), Verdict.BAD, reason="y" * 300)
    previous: list[str] = []
    generations: list[Generation] = []
    for number in range(33):
        child = run_python(
            RECORD_FOREVER,
            str(ledger_path),
            str(number),
            inputs.model_dump_json(),
            template.model_dump_json(),
        )
        assert child.stdout is not None
        if number % 6 == 5:
            # now and then anywhere, even while the child starts or opens the ledger
            time.sleep(rng.uniform(0.0, 0.3))
        else:
            assert child.stdout.readline() == "open\n", "the writer died before recording"
            time.sleep(rng.uniform(0.02, 0.15))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        complete_lines = [line for line in out.splitlines(keepends=True) if line.endswith("\n")]
        reported = [line.strip() for line in complete_lines if line != "open\n"]

        if not ledger_path.exists():  # killed before the new ledger was first written
            assert reported == []
            generations.append(Generation(number, [], []))
            continue
        document = Ledger.read(ledger_path)  # parses and validates, or raises
        ids = [a.run_id for a in document.attempts]
        assert ids[: len(previous)] == previous, "an earlier record changed or vanished"
        mine = ids[len(previous) :]
        assert mine == [f"g{number}-{i}" for i in range(len(mine))]
        # every reported run is on disk; at most the one in flight when killed is extra
        assert mine[: len(reported)] == reported
        assert len(mine) - len(reported) in (0, 1)
        for i, attempt in enumerate(document.attempts[len(previous) :]):
            assert attempt.model_copy(update={"run_id": "template", "metrics": {}}) == (
                template.model_copy(update={"metrics": {}})
            )
            assert attempt.metrics == {"i": i}
        previous = ids
        generations.append(Generation(number, reported, mine))

    killed_while_recording = [g for g in generations if g.reported]
    assert len(killed_while_recording) >= 20, "the kills must land while attempts are recorded"
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        assert [a.run_id for a in ledger.document.attempts] == previous
    assert stray_temp_files(ledger_path.parent) == []


# --- property: whatever is recorded reads back unchanged --------------------------------------

shas = st.text(alphabet="0123456789abcdef", min_size=40, max_size=40)
short_text = st.text(max_size=20)
moments = st.datetimes(
    timezones=st.sampled_from([None, timezone.utc, timezone(timedelta(hours=5, minutes=30))])
)
attempt_fields = st.fixed_dictionaries(
    {
        "level": st.sampled_from(["pypto", "simpler", "split"]),
        "pypto_sha": shas,
        "simpler_sha": st.none() | shas,
        "verdict": st.sampled_from(list(Verdict)),
        "reason": st.text(),
        "exit_code": st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
        "build_s": st.floats(),
        "run_s": st.floats(),
        "image_id": st.none() | short_text,
        "wheel_digests": st.dictionaries(st.sampled_from(["pypto", "simpler"]), short_text),
        "builds": st.dictionaries(
            st.sampled_from(["pypto", "simpler"]),
            st.sampled_from(["built", "cached", "failed", "failed-cached"]),
        ),
        "log_path": st.none() | short_text,
        "artifacts_dir": st.none() | short_text,
        "metrics": st.dictionaries(
            short_text,
            st.floats() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | short_text,
            max_size=4,
        ),
        "device": st.none() | short_text,
        "started_at": moments,
        "finished_at": moments,
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(attempt_fields, max_size=6))
def test_any_list_of_attempts_reads_back_exactly_as_recorded(fields: list[dict]) -> None:
    attempts = [Attempt(run_id=f"run-{i}", **f) for i, f in enumerate(fields)]
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "ledger.json"
        inputs = make_inputs(Path(workdir))
        with Ledger.open(path, inputs, tool_version="0.1.0") as ledger:
            for attempt in attempts:
                ledger.record(attempt)
        read: LedgerDocument = Ledger.read(path)

    # compared as JSON: NaN never equals itself, and the text shows an int turned float
    assert [a.model_dump_json() for a in read.attempts] == [a.model_dump_json() for a in attempts]
    for got, recorded in zip(read.attempts, attempts, strict=True):
        assert got.started_at.utcoffset() == recorded.started_at.utcoffset()
        assert {k: type(v) for k, v in got.metrics.items()} == {
            k: type(v) for k, v in recorded.metrics.items()
        }


# --- git bisect log ---------------------------------------------------------------------------


@dataclass
class LinearHistory:
    path: Path
    shas: list[str]  # oldest first
    subjects: dict[str, str]

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "Ledger Test",
            "GIT_AUTHOR_EMAIL": "ledger@example.invalid",
            "GIT_COMMITTER_NAME": "Ledger Test",
            "GIT_COMMITTER_EMAIL": "ledger@example.invalid",
        }
        return subprocess.run(
            ["git", *args], cwd=self.path, env=env, text=True, capture_output=True, check=check
        )


@pytest.fixture
def history(tmp_path: Path) -> LinearHistory:
    """Eight commits c0..c7 on one branch, like a slice of pypto's first-parent history."""
    repo = LinearHistory(tmp_path / "pypto", [], {})
    repo.path.mkdir()
    repo.git("init", "-q", "-b", "main")
    for n in range(8):
        (repo.path / "factor.txt").write_text(f"{n}\n")
        repo.git("add", "factor.txt")
        repo.git("commit", "-q", "-m", f"step {n}: tune the decode kernel")
        head = repo.git("rev-parse", "HEAD").stdout.strip()
        repo.shas.append(head)
        repo.subjects[head] = f"step {n}: tune the decode kernel"
    return repo


def replay(
    history: LinearHistory, doc: LedgerDocument, pins: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    log = history.path.parent / "bisect.log"
    log.write_text(to_git_bisect_log(doc, history.subjects, pins=pins))
    history.git("bisect", "reset", check=False)
    return history.git("bisect", "replay", str(log), check=False)


def bisect_document(history: LinearHistory, attempts: list[Attempt]) -> LedgerDocument:
    c = history.shas
    inputs = make_inputs(history.path.parent, good=c[0], bad=c[7], pypto_repo=str(history.path))
    return LedgerDocument(tool_version="0.1.0", created_at=T0, inputs=inputs, attempts=attempts)


def test_git_bisect_replay_of_a_finished_ledger_names_the_same_first_bad_commit(
    history: LinearHistory,
) -> None:
    c = history.shas
    doc = bisect_document(
        history,
        [
            make_attempt("e1", c[0], verdict=Verdict.GOOD),  # endpoint checks
            make_attempt("e2", c[7], verdict=Verdict.BAD),
            make_attempt("r1", c[3], verdict=Verdict.GOOD),
            make_attempt("r2", c[5], sha("s"), verdict=Verdict.BAD),
            # a simpler-level attempt is not a pypto verdict and must not reach git
            make_attempt("s1", c[2], sha("s"), verdict=Verdict.BAD, level="simpler"),
            make_attempt("r3", c[4], verdict=Verdict.BAD),
        ],
    )
    log = to_git_bisect_log(doc, history.subjects)
    assert log.splitlines()[:3] == [
        f"# bad: [{c[7]}] step 7: tune the decode kernel",
        f"# good: [{c[0]}] step 0: tune the decode kernel",
        f"git bisect start '--first-parent' '{c[7]}' '{c[0]}'",
    ]
    assert f"# good: [{c[3]}] step 3: tune the decode kernel\ngit bisect good {c[3]}\n" in log

    result = replay(history, doc)
    assert result.returncode == 0, result.stderr
    assert f"{c[4]} is the first bad commit" in result.stdout
    assert history.git("rev-parse", "refs/bisect/bad").stdout.strip() == c[4]


def test_a_flaky_commit_is_replayed_with_its_latest_verdict(history: LinearHistory) -> None:
    c = history.shas
    doc = bisect_document(
        history,
        [
            make_attempt("r1", c[3], verdict=Verdict.GOOD),
            make_attempt("r2", c[5], verdict=Verdict.BAD),
            make_attempt("r3", c[4], verdict=Verdict.BAD),
            make_attempt("r4", c[4], verdict=Verdict.GOOD),  # repeat: the mismatch was noise
        ],
    )
    assert to_git_bisect_log(doc).count(c[4]) == 2  # one comment, one command
    result = replay(history, doc)
    assert result.returncode == 0, result.stderr
    assert f"{c[5]} is the first bad commit" in result.stdout


def test_a_commit_is_replayed_with_what_most_runs_at_its_own_pointer_said_at_any_stage(
    history: LinearHistory,
) -> None:
    """The joint descent re-runs pypto commits at their own pointers and records them at the
    simpler stage: they count, by majority; runs of the commit with another pointer do not."""
    c, own = history.shas, sha("own pointer")
    doc = bisect_document(
        history,
        [
            make_attempt("r1", c[3], own, verdict=Verdict.GOOD),
            make_attempt("r2", c[5], own, verdict=Verdict.BAD),
            make_attempt("r3", c[4], own, verdict=Verdict.GOOD),  # the lie that steered
            make_attempt("s1", c[4], own, verdict=Verdict.BAD, level="simpler"),
            *(
                make_attempt(f"o{i}", c[4], sha("other"), verdict=Verdict.GOOD, level="simpler")
                for i in range(3)
            ),
            make_attempt("s2", c[4], own, verdict=Verdict.BAD, level="simpler"),
            make_attempt("d1", c[3], own, verdict=Verdict.BAD, level="drift"),
        ],
    )
    pins = {commit: own for commit in c}

    log = to_git_bisect_log(doc, pins=pins)

    assert f"# 1 passing and 2 failing runs: bad, as most of them\n# bad: [{c[4]}]" in log
    assert log.count(c[3]) == 2, "the drift re-run is not a verdict of the bisect"
    result = replay(history, doc, pins)
    assert result.returncode == 0, result.stderr
    assert f"{c[4]} is the first bad commit" in result.stdout
    assert f"{c[5]} is the first bad commit" in replay(history, doc).stdout, "pypto stage only"


def test_flaky_majorities_that_contradict_the_order_still_replay_to_one_boundary(
    history: LinearHistory,
) -> None:
    """c4 failed twice and passed once, c5 passed twice and failed once (a flaky session): by
    majority c5 is good after a bad c4, and git refused the log ("was both good and bad").
    Marked by their side of one boundary, the session's when given, they replay."""
    c = history.shas
    verdicts = [(c[2], Verdict.GOOD), (c[6], Verdict.BAD), (c[5], Verdict.GOOD)]
    verdicts += [(c[5], Verdict.GOOD), (c[5], Verdict.BAD), (c[4], Verdict.BAD)]
    verdicts += [(c[4], Verdict.GOOD), (c[4], Verdict.BAD)]
    doc = bisect_document(
        history,
        [make_attempt(f"r{i}", commit, verdict=v) for i, (commit, v) in enumerate(verdicts)],
    )
    log = history.path.parent / "bisect.log"

    def replayed(**given: object) -> subprocess.CompletedProcess[str]:
        log.write_text(to_git_bisect_log(doc, history.subjects, order=c, **given))  # type: ignore[arg-type]
        history.git("bisect", "reset", check=False)
        return history.git("bisect", "replay", str(log), check=False)

    alone = replay(history, doc)  # by majority alone
    assert "was both good and bad" in alone.stdout + alone.stderr
    fewest = replayed()
    assert fewest.returncode == 0, fewest.stderr
    # Three runs disagree with c4 as the first bad commit, and with c6; four with c5.
    assert history.git("rev-parse", "refs/bisect/bad").stdout.strip() == c[4]
    assert "2 passing and 1 failing runs: bad, as the boundary fewest runs disagree" in (
        log.read_text()
    )
    session = replayed(boundary=c[6])
    assert session.returncode == 0, session.stderr
    assert f"{c[6]} is the first bad commit" in session.stdout
    said = f"1 passing and 2 failing runs: good, as the session's first bad commit {c[6][:12]}"
    assert said in log.read_text()


def test_an_unfinished_ledger_replays_to_the_same_open_bisect(history: LinearHistory) -> None:
    c = history.shas
    doc = bisect_document(
        history,
        [
            make_attempt("r1", c[3], verdict=Verdict.GOOD),
            make_attempt("r2", c[5], verdict=Verdict.SKIP, reason="compile error"),
        ],
    )
    assert f"# skip: [{c[5]}]\ngit bisect skip {c[5]}\n" in to_git_bisect_log(doc)
    result = replay(history, doc)
    assert result.returncode == 0, result.stderr
    assert "first bad commit" not in result.stdout
    refs = history.git("for-each-ref", "--format=%(refname) %(objectname)", "refs/bisect")
    assert sorted(refs.stdout.splitlines()) == sorted(
        [
            f"refs/bisect/bad {c[7]}",
            f"refs/bisect/good-{c[0]} {c[0]}",
            f"refs/bisect/good-{c[3]} {c[3]}",
            f"refs/bisect/skip-{c[5]} {c[5]}",
        ]
    )
    head = history.git("rev-parse", "HEAD").stdout.strip()
    assert head in (c[4], c[6]), "git waits on an untested commit between the verdicts"


def test_a_ledger_with_only_its_endpoints_replays_to_a_started_bisect(
    history: LinearHistory,
) -> None:
    c = history.shas
    result = replay(history, bisect_document(history, []))
    assert result.returncode == 0, result.stderr
    refs = history.git("for-each-ref", "--format=%(refname)", "refs/bisect").stdout.split()
    assert sorted(refs) == sorted(["refs/bisect/bad", f"refs/bisect/good-{c[0]}"])


@pytest.fixture
def merged_history(history: LinearHistory) -> LinearHistory:
    """`history` with a branch forked at c3 and merged after c7 (commit m), then d9 on top.

    ``shas`` stays the first-parent chain c0..c7, m, d9; the branch's two commits are off it.
    """
    history.git("checkout", "-q", "-b", "side", history.shas[3])
    for n in (1, 2):
        (history.path / f"side{n}.txt").write_text(f"{n}\n")
        history.git("add", f"side{n}.txt")
        history.git("commit", "-q", "-m", f"side {n}: another kernel")
    history.git("checkout", "-q", "main")
    history.git("merge", "-q", "--no-ff", "-m", "merge side", "side")
    (history.path / "factor.txt").write_text("9\n")
    history.git("commit", "-q", "-am", "step 9")
    for ref in ("HEAD~1", "HEAD"):
        head = history.git("rev-parse", ref).stdout.strip()
        history.shas.append(head)
        history.subjects[head] = history.git("log", "-1", "--format=%s", head).stdout.strip()
    return history


def test_git_bisect_replay_on_a_history_with_merges_follows_first_parents_like_the_tool(
    merged_history: LinearHistory,
) -> None:
    c = merged_history.shas  # c0..c7, m = c[8], d9 = c[9]
    inputs = make_inputs(
        merged_history.path.parent, good=c[0], bad=c[9], pypto_repo=str(merged_history.path)
    )
    attempts = [
        make_attempt("001", c[5], verdict=Verdict.GOOD),
        make_attempt("002", c[7], verdict=Verdict.GOOD),
        make_attempt("003", c[8], verdict=Verdict.BAD),
    ]
    doc = LedgerDocument(tool_version="0.1.0", created_at=T0, inputs=inputs, attempts=attempts)

    result = replay(merged_history, doc)

    assert result.returncode == 0, result.stderr
    # The tool blamed the merge; git agrees only when it also walks first parents (without
    # --first-parent the side commits stay untested and git names no first bad commit).
    assert f"{c[8]} is the first bad commit" in result.stdout
    log = merged_history.git("bisect", "log").stdout
    assert "--first-parent" in log


def test_run_folders_continue_numbering_and_are_never_reused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first, folder = claim_run_dir(runs, "aaaa-none")
    (folder / "output.log").write_text("evidence")
    (runs / "004-killed-none").mkdir()  # a run killed before it was recorded

    second, _ = claim_run_dir(runs, "aaaa-none")
    third, _ = claim_run_dir(runs, "bbbb-none", taken=["009-bbbb-none"])

    assert (first, second, third) == ("001-aaaa-none", "005-aaaa-none", "010-bbbb-none")
    assert (folder / "output.log").read_text() == "evidence"
    assert sorted(p.name for p in runs.iterdir()) == [
        "001-aaaa-none",
        "004-killed-none",
        "005-aaaa-none",
        "010-bbbb-none",
    ]


def test_run_folders_claimed_by_racing_processes_are_all_distinct(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from runner.ledger import claim_run_dir\n"
        "for _ in range(20): print(claim_run_dir(Path(sys.argv[1]), 'x')[0])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "runs")],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        for _ in range(4)
    ]
    ids = [line for proc in procs for line in proc.communicate()[0].split()]
    assert len(ids) == 80 and len(set(ids)) == 80


def test_the_session_wall_time_sums_every_invocation_interrupted_ones_included(
    ledger_path: Path, tmp_path: Path
) -> None:
    inputs = make_inputs(tmp_path)
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.start_invocation(time.monotonic() - 100.0)
        this = ledger.finish_invocation()
    assert 100.0 <= this < 110.0
    # the figure returned is the one recorded: a report of a first invocation shows one number
    assert Ledger.read(ledger_path).wall_s == this
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.start_invocation(time.monotonic() - 20.0)
        # interrupted: nobody finishes the invocation, closing the ledger does
    document = Ledger.read(ledger_path)
    assert len(document.invocations) == 2
    assert 120.0 <= document.wall_s < 140.0
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0"):
        pass  # a command that ran nothing adds no invocation and leaves the file as it was
    assert Ledger.read(ledger_path) == document


def test_a_run_killed_outright_still_counts_up_to_its_last_attempt(
    ledger_path: Path, tmp_path: Path
) -> None:
    """SIGKILL never reaches `close`: a resumed session's report gave only the resumed run's
    time. Every recorded attempt keeps the running invocation's entry up to date."""
    inputs = make_inputs(tmp_path)
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.start_invocation(time.monotonic() - 100.0)
        ledger.finish_invocation()
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.start_invocation(time.monotonic() - 30.0)
        ledger.record(make_attempt("001", inputs.good))
        ledger.record(make_attempt("002", inputs.bad, verdict=Verdict.BAD))
        on_disk = Ledger.read(ledger_path)  # what a SIGKILL now would leave
        assert len(on_disk.invocations) == 2, "one entry for the running invocation, kept"
        assert 30.0 <= on_disk.invocations[-1].wall_s < 40.0
        assert 130.0 <= on_disk.wall_s < 150.0
        this = ledger.finish_invocation()
    document = Ledger.read(ledger_path)
    assert len(document.invocations) == 2 and document.invocations[-1].wall_s == this
    assert document.invocations[-1].started_at == on_disk.invocations[-1].started_at


def test_a_new_session_keeps_the_old_ledger_as_a_named_earlier_session(
    ledger_path: Path, tmp_path: Path
) -> None:
    old = make_inputs(tmp_path)
    with Ledger.open(ledger_path, old, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("001-a", sha(1)))
    before = ledger_path.read_bytes()
    new = make_inputs(tmp_path, platform="a5sim")
    with Ledger.open(ledger_path, new, tool_version="0.1.0", new_session=True) as ledger:
        backup = ledger.backup
    with Ledger.open(ledger_path, new, tool_version="0.1.0", new_session=True) as ledger:
        second = ledger.backup

    assert backup is not None and second is not None and backup != second
    assert backup.read_bytes() == before
    sessions = earlier_sessions(ledger_path)
    assert list(sessions.values()) == [backup, second]
    name = next(iter(sessions))
    assert earlier_session(ledger_path, name) == backup
    assert earlier_session(ledger_path, backup.name) == backup
    assert session_copy(backup, "settings.json").name == f"settings.json.{name}.bak"
    with pytest.raises(LedgerError, match="no earlier session 'nope'"):
        earlier_session(ledger_path, "nope")


def test_a_sha_names_its_commits_own_verdict_and_an_ambiguous_prefix_is_refused(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    culprit, other = "ab12" + "0" * 36, "ab34" + "0" * 36
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("r1", culprit, sha("s1"), Verdict.BAD))
        ledger.record(make_attempt("r2", other, sha("s1"), Verdict.GOOD))
        # the second level ran the culprit with an older simpler afterwards: it passed
        ledger.record(make_attempt("r3", culprit, sha("s0"), Verdict.GOOD, level="simpler"))
    doc = Ledger.read(ledger_path)

    assert [a.run_id for a in doc.named("r3")] == ["r3"]
    assert [a.run_id for a in doc.named("ab12")] == ["r1"], "the commit's own verdict first"
    assert [a.run_id for a in doc.named("AB34")] == ["r2"]
    assert doc.named("ffff") == [] and doc.named("") == []
    with pytest.raises(BadInput, match="matches several commits"):
        doc.named("ab")


def test_a_short_run_number_names_its_run_and_a_longer_one_not_when_it_starts_a_sha(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    first, second, third = "ab12" + "0" * 36, "0070" + "f" * 36, "0120" + "e" * 36
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("006-ab120000", first, sha("s1"), Verdict.GOOD))
        ledger.record(make_attempt("007-0070ffff", second, sha("s1"), Verdict.BAD))
        ledger.record(make_attempt("009-0120eeee", third, sha("s1"), Verdict.BAD))
        ledger.record(make_attempt("012-ab120000", first, sha("s2"), Verdict.GOOD))
    doc = Ledger.read(ledger_path)

    assert [a.run_id for a in doc.named("6")] == ["006-ab120000"]
    assert [a.run_id for a in doc.named("006")] == ["006-ab120000"]
    assert [a.run_id for a in doc.named("0070")] == ["007-0070ffff"], "a SHA prefix as before"
    assert doc.named("8") == []
    # Run 7 and the only commit starting 007 are one attempt: no reason to refuse it.
    assert [a.run_id for a in doc.named("007")] == ["007-0070ffff"]
    # Under four digits a number is a run's: git never abbreviates a SHA to fewer, and "5"
    # starts some SHA in any history of a few dozen commits.
    assert [a.run_id for a in doc.named("012")] == ["012-ab120000"]
    assert [a.run_id for a in doc.named("12")] == ["012-ab120000"]
    assert [a.run_id for a in doc.named("0120")] == ["009-0120eeee"]


def test_limits_judge_an_attempt_from_its_figures_and_keep_the_examples_word():
    from runner.ledger import judged
    from runner.verdict import Tolerance

    passed = make_attempt("001", "a" * 40, verdict=Verdict.GOOD, metrics={"max_abs_diff": 0.002})
    strict = judged(passed, Tolerance(max_abs_diff=0.001))
    assert strict.verdict is Verdict.BAD
    assert strict.reason == "max_abs_diff 0.002 > 0.001 (the example: good: [RUN] PASS)"
    assert judged(passed, Tolerance(max_abs_diff=0.01)) is passed
    assert judged(passed, None) is passed
    failed = make_attempt("002", "b" * 40, verdict=Verdict.BAD, metrics={"max_abs_diff": 0.5})
    relaxed = judged(failed, Tolerance(max_abs_diff=1.0))
    assert relaxed.verdict is Verdict.GOOD and "(the example: bad" in relaxed.reason
    assert failed.verdict is Verdict.BAD, "the recorded attempt itself is left alone"


def test_resuming_on_other_cards_keeps_every_verdict(ledger_path: Path, tmp_path: Path) -> None:
    """A card that left the host (or one added) is this run's choice, not another session."""
    both = make_inputs(tmp_path, devices=["0", "1"])
    with Ledger.open(ledger_path, both, tool_version="0.1.0") as ledger:
        ledger.record(make_attempt("001", "a" * 40))
    one = make_inputs(tmp_path, devices=["0"])
    with Ledger.open(ledger_path, one, tool_version="0.1.0") as ledger:
        assert [a.run_id for a in ledger.document.attempts] == ["001"]
    assert Ledger.read(ledger_path).inputs.devices == ["0"]
    other = make_inputs(tmp_path, devices=["0"], platform="a5")
    with pytest.raises(LedgerError, match="belongs to another session"):
        Ledger.open(ledger_path, other, tool_version="0.1.0")


def test_images_layered_ahead_are_kept_once_each_and_older_ledgers_have_none(
    ledger_path: Path, inputs: SessionInputs
) -> None:
    with Ledger.open(ledger_path, inputs, tool_version="0.1.0") as ledger:
        ledger.record_ahead([], ["sha256:" + "a" * 64, "sha256:" + "b" * 64])
        ledger.record_ahead([], ["sha256:" + "a" * 64])  # layered ahead again, then used
    assert Ledger.read(ledger_path).ahead_images == ["sha256:" + "a" * 64, "sha256:" + "b" * 64]

    data = json.loads(ledger_path.read_text())
    del data["ahead_images"]  # as an earlier version wrote it
    ledger_path.write_text(json.dumps(data))
    assert Ledger.read(ledger_path).ahead_images == []


def test_the_reports_name_the_limits_and_the_failures_they_could_not_judge(tmp_path) -> None:
    from runner.verdict import Tolerance
    from runner.workflow import limit_notes

    attempts = [
        make_attempt("001", sha(1), verdict=Verdict.BAD, metrics={"max_abs_diff": 0.01}),
        make_attempt("002", sha(2), verdict=Verdict.BAD, metrics={"note": "max error 1e-4"}),
        make_attempt("003", sha(3), verdict=Verdict.BAD, metrics={}),
        make_attempt("004", sha(4), verdict=Verdict.GOOD, metrics={}),
        make_attempt(
            "005",
            sha(5),
            verdict=Verdict.BAD,
            metrics={"max_abs_diff": 1e-4, "failed_tensor_count": 2},
        ),
    ]
    doc = LedgerDocument(
        tool_version="0.1.0", created_at=T0, inputs=make_inputs(tmp_path), attempts=attempts
    )
    limits = Tolerance(max_abs_diff=1e-3, max_rel_diff=0.5)

    notes = limit_notes(doc.judged(limits), limits)

    assert notes == [
        "verdicts judged by the limits max_abs_diff <= 0.001, max_rel_diff <= 0.5 on each run's "
        "figures, not by the example's PASS/FAIL",
        "3 failing runs printed no figure for max_abs_diff or max_rel_diff (for some failing "
        "tensor, or at all), so the limits could not judge them and the example's own FAIL "
        "stands (first: 002); check that its output prints the mismatch figures the reports list",
    ]
    assert limit_notes(doc, Tolerance()) == [] and limit_notes(doc, None) == []


def test_a_card_an_earlier_run_took_out_is_reported_as_such(tmp_path) -> None:
    from runner.findings import infrastructure_faults
    from runner.ledger import Invocation
    from runner.report import ReportFacts, build_json
    from runner.session import LevelResult, Outcome

    first, second = T0 + timedelta(minutes=1), T0 + timedelta(minutes=30)
    log = tmp_path / "infrastructure.log"
    log.write_text(
        f"{(first + timedelta(minutes=4)).isoformat()} abc - the example run of abc on device 0 "
        "hit a device or machine fault (aclInit); not a verdict\n"
        f"{(first + timedelta(minutes=5)).isoformat()} - - taken out of the pool: device 0: "
        "the example run of abc on device 0 hit a device or machine fault (aclInit)\n"
        f"{(second + timedelta(minutes=2)).isoformat()} - - taken out of the pool: device 2: "
        "the example run of def on device 2 hit a device or machine fault (aclInit)\n"
    )
    doc = LedgerDocument(
        tool_version="0.1.0",
        created_at=T0,
        inputs=make_inputs(tmp_path),
        invocations=[
            Invocation(started_at=first, wall_s=600),
            Invocation(started_at=second, wall_s=9),
        ],
    )
    good = doc.inputs.good
    back = make_attempt("001", good, device="0", started_at=second, finished_at=second)

    lines, earlier = infrastructure_faults(log, doc)

    assert len(lines) == 3 and earlier == lines[:2]
    outcome = Outcome("inconclusive", LevelResult("pypto", [doc.inputs.good, doc.inputs.bad]))
    notes = build_json(
        doc, outcome, ReportFacts(infrastructure=lines, earlier_infrastructure=earlier)
    )["notes"]
    assert any(
        n.startswith("device 0 was taken out of the pool by an earlier run of the session:")
        for n in notes
    ), notes
    assert any(
        n.startswith("device 2 was taken out of the pool: the example run of def") for n in notes
    ), notes
    assert any(n.startswith("1 infrastructure fault (") and " was retried " in n for n in notes)
    # Card 0 came back (the resume named it again) and ran: the note says so.
    doc.attempts.append(back)
    notes = build_json(
        doc, outcome, ReportFacts(infrastructure=lines, earlier_infrastructure=earlier)
    )["notes"]
    assert any(
        n.startswith(
            "device 0 was taken out of the pool by an earlier run of the session, and was back "
            "in the pool for the latest run: the example run of abc"
        )
        for n in notes
    ), notes


def test_report_json_is_strict_json_when_a_figure_is_nan_or_infinite(tmp_path) -> None:
    from runner.report import ReportFacts, write_reports
    from runner.session import LevelResult, Outcome

    attempts = [
        make_attempt("001", sha(1), verdict=Verdict.BAD, metrics={"max_abs_diff": math.nan}),
        make_attempt("002", sha(2), verdict=Verdict.BAD, metrics={"max_abs_diff": math.inf}),
    ]
    doc = LedgerDocument(
        tool_version="0.1.0", created_at=T0, inputs=make_inputs(tmp_path), attempts=attempts
    )
    outcome = Outcome("inconclusive", LevelResult("pypto", [doc.inputs.good, doc.inputs.bad]))

    json_path, md_path, _data = write_reports(tmp_path / "w", doc, outcome, ReportFacts())

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    data = json.loads(json_path.read_text(), parse_constant=refuse)
    figures = [step["metrics"]["max_abs_diff"] for step in data["steps"]]
    assert figures == ["NaN", "Infinity"]
    assert md_path.is_file()


def test_skip_reasons_beyond_the_three_commonest_are_counted_not_dropped(tmp_path) -> None:
    from runner.report import _untested_notes
    from runner.session import LevelResult, Outcome

    shas = [sha(i) for i in range(7)]
    reasons = ["compile error", "exit 0 without a PASS line", "exit 139 (SIGSEGV)", "exit 1: x"]
    attempts = [make_attempt("000", shas[0]), make_attempt("006", shas[6], verdict=Verdict.BAD)]
    attempts += [
        make_attempt(f"00{i}", shas[i], verdict=Verdict.SKIP).model_copy(
            update={"reason": reasons[min(i - 1, 3)]}
        )
        for i in range(1, 6)
    ]
    doc = LedgerDocument(
        tool_version="0.1.0", created_at=T0, inputs=make_inputs(tmp_path), attempts=attempts
    )
    level = LevelResult("pypto", shas, observations={0: [Verdict.GOOD], 6: [Verdict.BAD]})
    level.inconclusive = (1, 6)

    notes = _untested_notes(doc, Outcome("inconclusive", level))

    assert len(notes) == 4, notes
    assert notes[0] == "2 pypto candidates could not be tested: exit 1: x"
    assert notes[-1] == (
        "1 more candidate could not be tested for 1 other reason (the Steps table has each)"
    )


def test_a_moved_workdir_keeps_its_attempts_files_beside_its_ledger(tmp_path: Path) -> None:
    """Run folders (and the logs in them) follow the ledger; a log in the wheel cache, outside
    the workdir, and a folder the move did not bring stay as recorded. The next write keeps
    the new paths."""
    old = tmp_path / "work"
    runs = old / "runs"
    cache_log = tmp_path / "cache" / "logs" / "build.log"
    with Ledger.open(old / "ledger.json", make_inputs(tmp_path), tool_version="t") as ledger:
        for run_id, log in (("001-a", runs / "001-a" / "log.txt"), ("002-b", cache_log)):
            (runs / run_id).mkdir(parents=True)
            ledger.record(
                make_attempt(
                    run_id, sha(run_id), artifacts_dir=str(runs / run_id), log_path=str(log)
                )
            )
        ledger.record(make_attempt("003-c", sha("c"), artifacts_dir=str(runs / "003-c")))
    new = tmp_path / "elsewhere" / "work"
    new.parent.mkdir()
    old.rename(new)

    first, second, gone = Ledger.read(new / "ledger.json").attempts
    assert first.artifacts_dir == str(new / "runs" / "001-a")
    assert first.log_path == str(new / "runs" / "001-a" / "log.txt")
    assert second.artifacts_dir == str(new / "runs" / "002-b")
    assert second.log_path == str(cache_log)
    assert gone.artifacts_dir == str(runs / "003-c")  # never made: nothing to follow
    with Ledger.open(new / "ledger.json", make_inputs(tmp_path), tool_version="t") as ledger:
        ledger.record(make_attempt("004-d", sha("d")))
    assert str(old) + "/runs/001-a" not in (new / "ledger.json").read_text()
