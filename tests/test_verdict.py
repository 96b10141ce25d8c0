"""Verdicts from pypto-lib output: only a golden mismatch is bad, anything untestable is skip."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.errors import BadInput
from runner.sample.packages import EXAMPLE_PATH, write_lib, write_pypto
from runner.search import Verdict
from runner.verdict import Outcome, Tolerance, VerdictPatterns, judge, parse_metrics, stopped

PASS_LOG = """\
[INFO] PTO2_RING_HEAP=1073741824 PTO2_RING_TASK_WINDOW=16384
[RUN] compile ...
[W] ptoas: 3 warnings, 0 errors
[RUN] compile done (41.27s)
[RUN] compute golden ...
[RUN] compute golden done (0.31s)
[RUN] validate ...
[RUN]   'out' PASS  shape=(16, 5120) dtype=bfloat16 \
(ratio_allclose(atol=0.001, rtol=0.0078125, max_error_ratio=0.005))
[RUN]   'k_cache' PASS  shape=(16, 8, 128) dtype=bfloat16 (allclose)
[RUN] validate done (0.05s)
[RUN] PASS (48.91s)
"""

ALLCLOSE_FAIL_LOG = """\
[RUN] compile done (39.02s)
[RUN] validate ...
[RUN]   'out' FAIL  shape=(16, 256) dtype=float32 (allclose)
Traceback (most recent call last):
  File "/work/pypto-lib/models/qwen3_14b/decode_fwd.py", line 512, in <module>
    main()
  File "/work/pypto-lib/golden/runner.py", line 301, in _validate_outputs
    raise AssertionError("\\n".join(failures))
AssertionError: Output(s) does not match golden: ['out']
Mismatched elements: 12/4096  rtol=1e-05 atol=1e-05
max abs diff=0.00390625 at (3, 17) (tol=1.5e-05)
"""

RATIO_FAIL_LOG = """\
[RUN] validate ...
[RUN]   'attn_out' FAIL  shape=(16, 5120) dtype=bfloat16 (ratio_allclose)
[RUN]   'logits' FAIL  shape=(16, 1024) dtype=bfloat16 (ratio_allclose)
Error: Output(s) does not match golden: ['attn_out', 'logits']
attn_out:     ratio_allclose fail: error_count=1700/81920 (ratio=2.0752%, allowed<=0.5000%, \
threshold=410 pts)
    atol=0.001 rtol=0.0078125
    max abs diff=0.0625 at (3, 17) (tol=0.00878906)
logits:     ratio_allclose fail: error_count=5/16384 (ratio=0.0305%, allowed<=0.0100%, \
threshold=2 pts)
    atol=0.001 rtol=0.0078125
    max abs diff=0.25 at (0, 7) (tol=0.0088)
"""


def test_a_clean_pass_is_good_with_its_run_time() -> None:
    outcome = judge(0, PASS_LOG)

    assert outcome == Outcome(Verdict.GOOD, "pass", {"run_seconds": 48.91})


def test_a_golden_mismatch_is_bad_with_its_figures() -> None:
    outcome = judge(1, ALLCLOSE_FAIL_LOG)

    assert outcome.verdict is Verdict.BAD
    assert outcome.reason == "precision mismatch: 12/4096 elements, max abs diff 0.003906 [out]"
    assert outcome.metrics == {
        "mismatched": 12,
        "total": 4096,
        "mismatch_ratio": 12 / 4096,
        "rtol": 1e-05,
        "atol": 1e-05,
        "max_abs_diff": 0.00390625,
        "max_abs_diff_at": "(3, 17)",
        "tol": 1.5e-05,
        "failed_tensors": "out",
        "failed_tensor_count": 1,
    }


def test_several_failing_tensors_keep_the_worst_figures_and_a_count() -> None:
    outcome = judge(1, RATIO_FAIL_LOG)

    assert outcome.verdict is Verdict.BAD
    assert outcome.reason == (
        "ratio_allclose fail: 2.075% > 0.5%, max abs diff 0.25 [attn_out, logits]"
    )
    assert outcome.metrics["ratio_error_count"] == 1700
    assert outcome.metrics["ratio_total"] == 81920
    assert outcome.metrics["ratio_pct"] == pytest.approx(2.0752)
    assert outcome.metrics["ratio_allowed_pct"] == pytest.approx(0.5)
    assert outcome.metrics["ratio_threshold"] == 410
    assert outcome.metrics["max_abs_diff"] == 0.25
    assert outcome.metrics["max_abs_diff_at"] == "(0, 7)"
    assert outcome.metrics["failed_tensors"] == "attn_out,logits"
    assert outcome.metrics["failed_tensor_count"] == 2
    assert (outcome.metrics["atol"], outcome.metrics["rtol"]) == (0.001, 0.0078125)


def test_the_worst_of_several_allclose_mismatches_wins() -> None:
    output = (
        "Mismatched elements: 3/100  rtol=1e-05 atol=1e-05\n"
        "Mismatched elements: 90/1000  rtol=0.001 atol=0.001\n"
        "Mismatched elements: 4/100  rtol=1e-05 atol=1e-05\n"
        "Output(s) does not match golden: ['a', 'b', 'c']\n"
    )

    metrics = judge(1, output).metrics

    assert (metrics["mismatched"], metrics["total"], metrics["rtol"]) == (90, 1000, 0.001)
    assert metrics["failed_tensor_count"] == 3


def test_the_ratio_comparator_format_from_the_domain_notes_parses() -> None:
    output = (
        "ratio_allclose fail: error_count=5/100 (ratio=5.00%, allowed<=1.00%, threshold=0.5 pts)\n"
        "max abs diff=1.5e-02 at (4,) (tol=1e-03)\n"
    )

    outcome = judge(1, output)

    assert outcome.reason == "ratio_allclose fail: 5% > 1%, max abs diff 0.015"
    assert outcome.metrics["ratio_pct"] == 5.0
    assert outcome.metrics["ratio_threshold"] == 0.5
    assert outcome.metrics["tol"] == 1e-03


def test_a_mismatch_printed_before_a_clean_exit_is_still_bad() -> None:
    outcome = judge(0, "[RUN]   'out' FAIL  shape=(1,) dtype=float32 (allclose)\n[RUN] done\n")

    assert outcome.verdict is Verdict.BAD
    assert outcome.metrics["failed_tensors"] == "out"


def test_a_mismatch_wins_over_a_crash_exit_code() -> None:
    assert judge(134, ALLCLOSE_FAIL_LOG + "Aborted (core dumped)\n").verdict is Verdict.BAD


@pytest.mark.parametrize(
    ("exit_code", "output", "reason"),
    [
        pytest.param(
            1,
            "Traceback (most recent call last):\n"
            '  File "/work/lib/models/qwen3_14b/decode_fwd.py", line 12, in <module>\n'
            "    import pypto\n"
            "ModuleNotFoundError: No module named 'pypto'\n"
            "[INFO] cleaning up\n",
            "exit 1: ModuleNotFoundError: No module named 'pypto'",
            id="import-error",
        ),
        pytest.param(
            3,
            "[RUN] compile done (2.00s)\n[ERROR] aclInit failed: /dev/davinci0 not found\n",
            "exit 3: [ERROR] aclInit failed: /dev/davinci0 not found",
            id="no-device",
        ),
        pytest.param(
            1,
            "[RUN] run ...\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3/site-packages/pypto/runtime/runner.py", line 88, in run\n'
            "    _execute_dfx_passes(cfg)\n"
            "RuntimeError: run failed with code 507901\n",
            "exit 1: RuntimeError: run failed with code 507901",
            id="device-error",
        ),
        pytest.param(
            2,
            "kernels/aiv/attn.cpp:41:9: error: use of undeclared identifier 'tile_x'\n"
            "1 error generated.\n"
            "make: *** [kernels] Error 1\n",
            "exit 2: make: *** [kernels] Error 1",
            id="compile-error",
        ),
        pytest.param(
            139,
            "[RUN] run ...\nSegmentation fault (core dumped)\n",
            "exit 139 (SIGSEGV): Segmentation fault (core dumped)",
            id="segfault",
        ),
        pytest.param(
            1, PASS_LOG + "teardown hung up\n", "exit 1: teardown hung up", id="crash-after-pass"
        ),
        pytest.param(0, "[RUN] compile done (1.00s)\n", "exit 0 without a PASS line", id="no-pass"),
        pytest.param(5, "", "exit 5", id="silent"),
    ],
)
def test_failures_that_are_not_a_precision_mismatch_are_skipped(
    exit_code: int, output: str, reason: str
) -> None:
    outcome = judge(exit_code, output)

    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == reason


def test_a_timeout_is_skipped_even_after_a_pass_line() -> None:
    outcome = judge(None, PASS_LOG, timed_out=True, timeout_s=1800.0)

    assert outcome == Outcome(Verdict.SKIP, "timeout after 1800s", {"run_seconds": 48.91})


@pytest.mark.parametrize(("exit_code", "oom"), [(137, False), (0, True), (None, True)])
def test_the_oom_killer_is_skipped(exit_code: int | None, oom: bool) -> None:
    outcome = judge(exit_code, "[RUN] run ...\n", oom_killed=oom)

    assert (outcome.verdict, outcome.reason) == (Verdict.SKIP, "killed (out of memory?)")


@pytest.mark.parametrize("oom", [True, False])
def test_a_mismatch_before_the_oom_killer_or_a_sigkill_is_no_verdict(oom: bool) -> None:
    """A run killed from outside is no verdict, as a timeout is, whatever it printed first: it
    was recorded as bad (a golden mismatch, then killed under --memory), so an infrastructure
    fault picked the culprit."""
    outcome = judge(137, ALLCLOSE_FAIL_LOG, oom_killed=oom)

    assert (outcome.verdict, outcome.reason) == (Verdict.SKIP, "killed (out of memory?)")
    assert outcome.metrics  # the figures it printed stay in the log's record
    assert stopped(137, oom_killed=oom) is not None  # which the tester makes a fault


def test_a_run_without_an_exit_status_is_skipped() -> None:
    outcome = judge(None, "[RUN] compile ...\n")

    assert (outcome.verdict, outcome.reason) == (Verdict.SKIP, "no exit status: [RUN] compile ...")


def test_long_error_lines_are_cut_to_one_short_line() -> None:
    outcome = judge(1, "RuntimeError: " + "x" * 500 + "\n")

    assert outcome.reason.startswith("exit 1: RuntimeError: xxx")
    assert outcome.reason.endswith("...")
    assert len(outcome.reason) <= 160
    assert "\n" not in outcome.reason


def test_colour_codes_and_crlf_line_ends_do_not_hide_a_verdict() -> None:
    coloured = PASS_LOG.replace("[RUN] PASS", "\x1b[1;32m[RUN] PASS\x1b[0m").replace("\n", "\r\n")
    failing = ALLCLOSE_FAIL_LOG.replace(
        "[RUN]   'out' FAIL", "\x1b[31m[RUN]   'out' FAIL\x1b[0m"
    ).replace("\n", "\r\n")

    assert judge(0, coloured) == judge(0, PASS_LOG)
    assert judge(1, failing) == judge(1, ALLCLOSE_FAIL_LOG)


def test_a_pass_line_buried_in_noisy_logs_is_found() -> None:
    noise = "".join(f"[INFO] step {i}: tile=64 error_budget=0.5 ok\n" for i in range(2000))
    progress = "compiling 10%\r compiling 50%\r compiling 100%\r\n"

    assert judge(0, noise + progress + PASS_LOG + noise).verdict is Verdict.GOOD


def test_patterns_from_the_config_file_replace_the_defaults() -> None:
    patterns = VerdictPatterns.from_mapping({"good": "^ALL CHECKS OK$", "bad": ["DRIFT: \\d+"]})

    assert patterns.bad == ("DRIFT: \\d+",)
    assert judge(0, "warming up\nALL CHECKS OK\n", patterns=patterns).verdict is Verdict.GOOD
    assert judge(0, PASS_LOG, patterns=patterns).reason == "exit 0 without a PASS line"
    assert judge(0, "DRIFT: 17\n", patterns=patterns).verdict is Verdict.BAD


def test_a_config_section_that_names_one_kind_keeps_the_other_default() -> None:
    patterns = VerdictPatterns.from_mapping({"bad": ["DRIFT"]})

    assert patterns.good == VerdictPatterns().good
    assert VerdictPatterns.from_mapping({}) == VerdictPatterns()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"good": ["[RUN PASS"]}, "invalid 'good' regex"),
        ({"bad": []}, "'bad' is empty"),
        ({"pass": ["x"]}, "unknown key(s) pass"),
        ({"good": [3]}, "'good' must be a regex or a list of regexes"),
        (["good"], "must be a table"),
    ],
)
def test_bad_pattern_config_is_rejected_with_a_fix(data: object, message: str) -> None:
    with pytest.raises(BadInput, match="verdict patterns") as info:
        VerdictPatterns.from_mapping(data)  # type: ignore[arg-type]

    assert message in str(info.value)


def test_numpy_style_assertion_output_is_understood() -> None:
    output = (
        "AssertionError: \nNot equal to tolerance rtol=1e-07, atol=0.0001\n\n"
        "Mismatched elements: 1 / 1 (100%)\nMax absolute difference: 0.04014074\n"
        "Output(s) does not match golden: ['out']\n"
    )

    metrics = judge(1, output).metrics

    assert (metrics["mismatched"], metrics["total"]) == (1, 1)
    assert metrics["max_abs_diff"] == 0.04014074
    assert (metrics["rtol"], metrics["atol"]) == (1e-07, 0.0001)


def test_nan_outputs_count_as_the_worst_difference() -> None:
    output = "max abs diff=0.5 at (0,) (tol=0.01)\nmax abs diff=nan at (1,) (tol=0.01)\n"

    assert math.isnan(float(parse_metrics(output)["max_abs_diff"]))


def run_sample(
    workdir: Path, *, factor: float = 1.0, platform: str = "a2a3sim"
) -> subprocess.CompletedProcess[str]:
    """Run the sample pypto-lib example against a sample pypto on the host, without Docker.

    Generated code lands in `workdir/artifacts/build_output`, as in a container run.
    """
    pypto, lib = workdir / "pypto", workdir / "lib"
    write_pypto(pypto, revision=1, factor=factor, uses_simpler=False)
    write_lib(lib)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(pypto), str(lib)]),
        "PYPTO_PROG_BUILD_DIR": str(workdir / "artifacts" / "build_output"),
    }
    return subprocess.run(
        [sys.executable, str(lib / EXAMPLE_PATH), "-p", platform, "-d", "0"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("factor", "platform", "verdict", "reason"),
    [
        (1.0, "a2a3sim", Verdict.GOOD, "pass"),
        (1.001, "a2a3sim", Verdict.BAD, "precision mismatch: 1/1 elements, max abs diff 0.003875"),
        (1.0, "a2a3", Verdict.SKIP, "exit 3: [ERROR] aclInit failed: /dev/davinci0 not found"),
    ],
)
def test_the_sample_example_is_judged_like_a_real_one(
    tmp_path: Path, factor: float, platform: str, verdict: Verdict, reason: str
) -> None:
    reason += " [out]" if verdict is Verdict.BAD else ""
    if platform == "a2a3" and Path("/dev/davinci0").exists():
        pytest.skip("this host has an NPU device node")
    run = run_sample(tmp_path, factor=factor, platform=platform)

    outcome = judge(run.returncode, run.stdout + run.stderr)

    assert (outcome.verdict, outcome.reason) == (verdict, reason)


FRAGMENTS = [
    *PASS_LOG.splitlines(keepends=True),
    *ALLCLOSE_FAIL_LOG.splitlines(keepends=True),
    *RATIO_FAIL_LOG.splitlines(keepends=True),
    "Mismatched elements: 0/0  rtol=nan atol=inf\n",
    "ratio_allclose fail: error_count=1/0 (ratio=inf%, allowed<=nan%, threshold=x pts)\n",
    "max abs diff=-inf at ( (tol=)\n",
    "Traceback (most recent call last):\n",
    "\x1b[31m",
    "\r",
]


@settings(max_examples=300, deadline=None)
@given(
    exit_code=st.none() | st.integers(min_value=-5, max_value=300),
    output=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=40), max_size=30).map("".join),
    timed_out=st.booleans(),
    oom_killed=st.booleans(),
)
def test_judge_never_raises_on_any_output(
    exit_code: int | None, output: str, timed_out: bool, oom_killed: bool
) -> None:
    outcome = judge(exit_code, output, timed_out=timed_out, oom_killed=oom_killed)

    assert outcome.reason
    assert "\n" not in outcome.reason
    assert len(outcome.reason) <= 160
    if outcome.verdict is Verdict.GOOD:
        assert exit_code == 0
        assert not (timed_out or oom_killed)


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    bad=st.integers(min_value=0, max_value=10**9),
    extra=st.integers(min_value=1, max_value=10**9),
    rtol=finite,
    atol=finite,
    diff=finite,
    tol=finite,
    style=st.sampled_from(["%g", "%e", "%.17g", "%.3e"]),
)
def test_figures_printed_with_g_or_e_read_back_exactly(
    bad: int, extra: int, rtol: float, atol: float, diff: float, tol: float, style: str
) -> None:
    rtol_s, atol_s, diff_s, tol_s = (style % value for value in (rtol, atol, diff, tol))
    output = (
        f"Mismatched elements: {bad}/{bad + extra}  rtol={rtol_s} atol={atol_s}\n"
        f"max abs diff={diff_s} at (0, 1) (tol={tol_s})\n"
    )

    metrics = parse_metrics(output)

    assert (metrics["mismatched"], metrics["total"]) == (bad, bad + extra)
    assert metrics["rtol"] == float(rtol_s)
    assert metrics["atol"] == float(atol_s)
    assert metrics["max_abs_diff"] == float(diff_s)
    assert metrics["tol"] == float(tol_s)


@settings(max_examples=200, deadline=None)
@given(
    errors=st.integers(min_value=0, max_value=10**9),
    total=st.integers(min_value=1, max_value=10**9),
    pct=finite,
    allowed=finite,
    threshold=finite,
    style=st.sampled_from(["%g", "%e"]),
)
def test_ratio_figures_printed_with_g_or_e_read_back_exactly(
    errors: int, total: int, pct: float, allowed: float, threshold: float, style: str
) -> None:
    pct_s, allowed_s, threshold_s = (style % value for value in (pct, allowed, threshold))
    output = (
        f"ratio_allclose fail: error_count={errors}/{total} "
        f"(ratio={pct_s}%, allowed<={allowed_s}%, threshold={threshold_s} pts)\n"
    )

    metrics = parse_metrics(output)

    assert (metrics["ratio_error_count"], metrics["ratio_total"]) == (errors, total)
    assert metrics["ratio_pct"] == float(pct_s)
    assert metrics["ratio_allowed_pct"] == float(allowed_s)
    assert metrics["ratio_threshold"] == float(threshold_s)


FAILING = """[RUN]   'out' FAIL  shape=(4,) dtype=float32 (allclose)
Error: Output(s) does not match golden: ['out']
Mismatched elements: 3/4  rtol=1e-05 atol=1e-06
max abs diff=0.0039 at (2,) (tol=4e-05)
max rel diff=0.001
"""


def test_relative_difference_is_parsed_beside_the_absolute_one() -> None:
    metrics = parse_metrics(FAILING + "Max relative difference: 0.25\n")
    assert metrics["max_abs_diff"] == pytest.approx(0.0039)
    assert metrics["max_rel_diff"] == pytest.approx(0.25)
    assert metrics["mismatch_ratio"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (Tolerance(max_abs_diff=0.01), Verdict.GOOD),
        (Tolerance(max_abs_diff=0.001), Verdict.BAD),
        (Tolerance(max_mismatch_ratio=0.8), Verdict.GOOD),
        (Tolerance(max_mismatch_ratio=0.5), Verdict.BAD),
        (Tolerance(max_rel_diff=0.01), Verdict.GOOD),
        (Tolerance(max_rel_diff=0.0001), Verdict.BAD),
        (Tolerance(max_abs_diff=0.01, max_rel_diff=0.0001), Verdict.BAD),
        (Tolerance(), Verdict.BAD),
    ],
)
def test_limits_on_the_figures_judge_a_failing_run(limits, expected) -> None:
    outcome = judge(1, FAILING)
    assert outcome.verdict is Verdict.BAD
    assert limits.apply(outcome.verdict, outcome.metrics) is expected


def test_limits_keep_passes_good_skips_skipped_and_unmeasured_failures_bad() -> None:
    limits = Tolerance(max_abs_diff=0.01)
    passing = judge(0, "[RUN]   'out' PASS  shape=(1,) dtype=float32\n[RUN] PASS (0.1s)\n")
    assert limits.apply(passing.verdict, passing.metrics) is Verdict.GOOD
    assert limits.apply(Verdict.SKIP, {"max_abs_diff": 0.0}) is Verdict.SKIP
    assert limits.apply(Verdict.BAD, {}) is Verdict.BAD
    assert limits.apply(Verdict.GOOD, {"max_abs_diff": math.nan}) is Verdict.BAD
    assert Tolerance(max_mismatch_ratio=0.1).apply(Verdict.BAD, {"ratio_pct": 5.0}) is Verdict.GOOD


def test_a_device_fault_is_named_by_its_whole_line():
    from runner.verdict import infrastructure_fault

    output = "[INFO] start\n[ERROR] aclInit failed: /dev/davinci1 not found\n[INFO] exit\n"
    why = infrastructure_fault(1, output)
    assert why == "hit a device or machine fault ([ERROR] aclInit failed: /dev/davinci1 not found)"
    assert infrastructure_fault(1, "does not match golden: [out]") is None


MIXED_COMPARATORS = (
    "[RUN]   'a' FAIL  shape=(64, 64) dtype=float32 (allclose)\n"
    "[RUN]   'b' FAIL  shape=(64, 64) dtype=bfloat16 (ratio_allclose)\n"
    "Output(s) does not match golden: ['a', 'b']\n"
    "Mismatched elements: 1/4096  rtol=1e-05 atol=1e-05\n"
    "ratio_allclose fail: error_count=2048/4096 (ratio=50.00%, allowed<=0.50%, threshold=4 pts)\n"
)
ONE_TENSOR_WITHOUT_A_FIGURE = (
    "[RUN]   'q' FAIL  shape=(8,) dtype=float32 (shape mismatch: got (4,))\n"
    "[RUN]   'k' FAIL  shape=(64, 64) dtype=float32 (allclose)\n"
    "Output(s) does not match golden: ['q', 'k']\n"
    "Mismatched elements: 1/4096  rtol=1e-05 atol=1e-05\n"
)


def test_the_mismatch_limit_takes_the_worse_of_both_comparators_over_every_tensor() -> None:
    outcome = judge(1, MIXED_COMPARATORS)
    limits = Tolerance(max_mismatch_ratio=0.01)

    assert outcome.metrics["mismatch_ratio_count"] == 2
    assert limits.apply(outcome.verdict, outcome.metrics) is Verdict.BAD
    assert limits.breach(outcome.metrics) == "mismatch_ratio 0.5 > 0.01"
    assert Tolerance(max_mismatch_ratio=0.6).apply(Verdict.BAD, outcome.metrics) is Verdict.GOOD


def test_a_failing_tensor_without_a_figure_keeps_the_examples_fail_under_limits() -> None:
    outcome = judge(1, ONE_TENSOR_WITHOUT_A_FIGURE)
    limits = Tolerance(max_mismatch_ratio=0.01)

    assert outcome.metrics["failed_tensor_count"] == 2
    assert not limits.reads(outcome.metrics)
    assert limits.apply(outcome.verdict, outcome.metrics) is Verdict.BAD
    assert limits.judge(outcome.verdict, outcome.reason, outcome.metrics)[1] == outcome.reason
    both = judge(1, ONE_TENSOR_WITHOUT_A_FIGURE + "Mismatched elements: 2/8  rtol=0 atol=0\n")
    assert limits.reads(both.metrics)
    assert limits.apply(both.verdict, both.metrics) is Verdict.BAD  # 2/8 > 1 %
    assert Tolerance(max_mismatch_ratio=0.3).apply(Verdict.BAD, both.metrics) is Verdict.GOOD


def test_a_failure_the_limits_pass_names_its_figures_first_and_the_table_cuts_at_a_word() -> None:
    from runner.report import _clip

    outcome = judge(1, FAILING)
    verdict, reason = Tolerance(max_abs_diff=0.01).judge(
        outcome.verdict, outcome.reason, outcome.metrics
    )
    assert verdict is Verdict.GOOD
    assert reason.startswith("within the limits: max_abs_diff 0.0039 <= 0.01 (the example: bad: ")
    # Cut to a table's width at a word's end, never inside a figure ("0.00" of 0.0039).
    clipped = _clip(reason, 60)
    assert clipped == "within the limits: max_abs_diff 0.0039 <= 0.01 (the …"
    assert len(clipped) <= 60 and _clip("short", 60) == "short"
