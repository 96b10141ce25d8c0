"""Turn one run of a pypto-lib example into good / bad / skip, plus the precision figures.

A bisect is only as good as its verdicts: calling a compile error "bad" would blame an innocent
commit, so only output that proves a precision failure (a golden mismatch) is bad; anything else
is "skip" (untestable), with a one-line reason a human can act on. Of those, `infrastructure_fault`
names the runs that say nothing about the commit (timeouts, the OOM killer, missing or busy
devices): the session retries them and never records them. Pure: text in, data out.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from runner.errors import BadInput
from runner.search import Verdict

__all__ = ["Outcome", "Tolerance", "VerdictPatterns", "clean_output", "judge", "parse_metrics"]

MetricValue = float | int | str

_REASON_LIMIT = 160

_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_NUM = r"[-+]?(?:inf|nan|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"

_MISMATCH = re.compile(r"Mismatched elements:\s*(\d+)\s*/\s*(\d+)")
_RTOL = re.compile(rf"\brtol\s*=\s*({_NUM})(?![\w.])", re.IGNORECASE)
_ATOL = re.compile(rf"\batol\s*=\s*({_NUM})(?![\w.])", re.IGNORECASE)
_MAX_ABS = re.compile(
    rf"max(?:imum)?[ _]abs(?:olute)?[ _]diff(?:erence)?\s*[=:]\s*({_NUM})"
    rf"(?:\s+at\s+(\([^)]*\)|\S+))?(?:\s*\(tol\s*=\s*({_NUM})\))?",
    re.IGNORECASE,
)
_NUMPY_MAX_ABS = re.compile(rf"Max absolute difference(?: among violations)?:\s*({_NUM})")
_MAX_REL = re.compile(
    rf"max(?:imum)?[ _]rel(?:ative)?[ _]diff(?:erence)?\s*[=:]\s*({_NUM})", re.IGNORECASE
)
_NUMPY_MAX_REL = re.compile(rf"Max relative difference(?: among violations)?:\s*({_NUM})")
_RATIO = re.compile(
    rf"ratio_allclose fail:\s*error_count\s*=\s*(\d+)\s*/\s*(\d+)"
    rf"(?:\s*\(ratio\s*=\s*({_NUM})%(?:,\s*allowed\s*<=\s*({_NUM})%)?"
    rf"(?:,\s*threshold\s*=\s*({_NUM})\s*pts)?)?"
)
_FAILED_TENSOR = re.compile(r"^\[RUN\]\s+'([^']*)'\s+FAIL\b", re.MULTILINE)
_GOLDEN_LIST = re.compile(r"does not match golden:\s*\[([^\]]*)\]")
_RUN_SECONDS = re.compile(rf"^\[RUN\] (?:PASS|FAIL)\b[^\n]*?\(({_NUM})\s*s\)", re.MULTILINE)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):", re.MULTILINE)
_ERRORISH = re.compile(
    r"(?<![A-Za-z_])(?:ERROR|error)\b|Error\b|FATAL|Fatal|(?<![a-z])fatal\b"
    r"|Segmentation fault|Aborted|core dumped|Killed"
)


@dataclass(frozen=True)
class VerdictPatterns:
    """Regexes (multiline) that recognise a pass and a precision failure.

    Overridable from the config file because example harnesses differ: a project with its own
    comparator can add its failure line without touching the code.
    """

    good: tuple[str, ...] = (r"^\[RUN\] PASS\b",)
    bad: tuple[str, ...] = (
        r"does not match golden",
        r"ratio_allclose fail",
        r"^\[RUN\]\s+'[^']*'\s+FAIL\b",
    )

    def __post_init__(self) -> None:
        for kind in ("good", "bad"):
            patterns = getattr(self, kind)
            if isinstance(patterns, str):
                patterns = (patterns,)
            patterns = tuple(patterns)
            if not patterns:
                raise BadInput(
                    f"verdict patterns: '{kind}' is empty; give at least one regex, "
                    "or leave it out to use the defaults"
                )
            for pattern in patterns:
                _compile(kind, pattern)
            object.__setattr__(self, kind, patterns)

    @classmethod
    def from_mapping(cls, data: Mapping) -> VerdictPatterns:
        """Build from a config section such as ``{"good": [...], "bad": [...]}``.

        A key left out keeps its default; a single string counts as a one-pattern list.
        """
        if not isinstance(data, Mapping):
            raise BadInput(
                "verdict patterns must be a table with 'good' and/or 'bad' lists of regexes"
            )
        unknown = sorted(str(key) for key in data if key not in ("good", "bad"))
        if unknown:
            raise BadInput(
                f"verdict patterns: unknown key(s) {', '.join(unknown)}; "
                "only 'good' and 'bad' are allowed"
            )
        values: dict[str, tuple[str, ...]] = {}
        for kind in ("good", "bad"):
            if kind not in data:
                continue
            raw = data[kind]
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, Iterable) or not all(isinstance(p, str) for p in items):
                raise BadInput(f"verdict patterns: '{kind}' must be a regex or a list of regexes")
            values[kind] = tuple(items)
        return cls(**values)

    def first_good(self, text: str) -> re.Match[str] | None:
        return _search_any(self.good, text)

    def first_bad(self, text: str) -> re.Match[str] | None:
        return _search_any(self.bad, text)


@lru_cache(maxsize=256)
def _compile(kind: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise BadInput(
            f"verdict patterns: invalid '{kind}' regex {pattern!r} ({exc}); fix it where it "
            f"was given (--verdict-{kind}, [verdict] {kind} in the config file, or the "
            "variable)"
        ) from None


def _search_any(patterns: tuple[str, ...], text: str) -> re.Match[str] | None:
    found = [m for p in patterns if (m := _compile("pattern", p).search(text))]
    return min(found, key=lambda m: m.start(), default=None)


@dataclass(frozen=True)
class Outcome:
    """What one run says about one commit; `reason` is one short line for reports and logs."""

    verdict: Verdict
    reason: str
    metrics: dict[str, MetricValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Tolerance:
    """Limits on the parsed precision figures that judge a run instead of the example's own
    PASS/FAIL.

    The example's comparator is often stricter (or looser) than what a team accepts; applying
    limits to the figures already in the ledger lets `report --rethreshold` re-judge a finished
    session without running anything. A run that printed no figure for a limit passed that limit
    if the example itself passed (a passing run prints no mismatch), and keeps its own verdict
    otherwise: a failure without figures cannot be re-judged.
    """

    max_mismatch_ratio: float | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in self.limits.values())

    @property
    def limits(self) -> dict[str, float | None]:
        return {
            "mismatch_ratio": self.max_mismatch_ratio,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
        }

    def apply(self, verdict: Verdict, metrics: Mapping[str, MetricValue]) -> Verdict:
        verdict = Verdict(verdict)
        if not self.active or verdict is Verdict.SKIP:
            return verdict
        figures = self._figures(metrics)
        if any(math.isnan(value) or value > limit for _, value, limit in figures):
            return Verdict.BAD
        if verdict is Verdict.BAD and not self.reads(metrics):
            return verdict  # a failing tensor printed no figure: its FAIL cannot be re-judged
        return Verdict.GOOD

    def describe(self) -> str:
        """The limits in force, as "max_abs_diff <= 0.001, max_rel_diff <= 0.5"."""
        return ", ".join(f"{k} <= {v:g}" for k, v in self.limits.items() if v is not None)

    def reads(self, metrics: Mapping[str, MetricValue]) -> bool:
        """Whether these limits can judge a run: it printed a figure for one of them for each
        failing tensor (one tensor printing a figure says nothing of another that printed
        none, a shape mismatch say)."""
        failing = metrics.get("failed_tensor_count", 1)
        counts = [_figure_count(metrics, key) for key, _value, _limit in self._figures(metrics)]
        return bool(counts) and max(counts) >= (failing if isinstance(failing, int) else 1)

    def breach(self, metrics: Mapping[str, MetricValue]) -> str | None:
        """The first limit the figures exceed, as "max_abs_diff 0.002 > 0.001"; None when none."""
        for key, value, limit in self._figures(metrics):
            if math.isnan(value) or value > limit:
                return f"{key} {value:g} > {limit:g}"
        return None

    def judge(
        self, verdict: Verdict, reason: str, metrics: Mapping[str, MetricValue]
    ) -> tuple[Verdict, str]:
        """The verdict these limits give a run and its reason; when they overrule the example,
        the reason names the limit and keeps what the example said."""
        verdict = Verdict(verdict)
        judged = self.apply(verdict, metrics)
        if judged is verdict:
            return verdict, reason
        said = f"{verdict.value}: {reason}" if reason else verdict.value
        return judged, f"{self.breach(metrics) or self.within(metrics)} (the example: {said})"

    def within(self, metrics: Mapping[str, MetricValue]) -> str:
        """The figures against their limits when none exceeds one, as "within the limits:
        max_abs_diff 0.0079 <= 0.01" (the figure first: a reason is cut to fit a table)."""
        figures = [f"{key} {value:g} <= {limit:g}" for key, value, limit in self._figures(metrics)]
        return f"within the limits: {', '.join(figures)}" if figures else "within the limits"

    def _figures(self, metrics: Mapping[str, MetricValue]) -> list[tuple[str, float, float]]:
        """(figure, value, limit) of each limit the run printed a figure for."""
        return [
            (key, value, limit)
            for key, limit in self.limits.items()
            if limit is not None and (value := _figure(metrics, key)) is not None
        ]


def _figure(metrics: Mapping[str, MetricValue], key: str) -> float | None:
    """The run's worst value of a limited figure; the mismatch ratio is the worse of the
    allclose comparator's and the ratio comparator's (which reports percent), as several
    tensors may fail under either."""
    values = [metrics.get(key)]
    if key == "mismatch_ratio" and _is_number(metrics.get("ratio_pct")):
        values.append(float(metrics["ratio_pct"]) / 100)
    numbers = [float(v) for v in values if _is_number(v)]
    if not numbers:
        return None
    return next((v for v in numbers if math.isnan(v)), max(numbers))


def printed_failure(metrics: Mapping[str, MetricValue]) -> bool:
    """Whether a run's output showed a golden mismatch (whatever limits made of it later)."""
    return any(key in metrics for key in ("mismatched", "ratio_error_count", "failed_tensors"))


def _figure_count(metrics: Mapping[str, MetricValue], key: str) -> int:
    """How many tensors printed the figure `key` (recorded from two up; older ledgers: one)."""
    count = metrics.get(f"{key}_count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) else 1


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def clean_output(output: str) -> str:
    """Strip ANSI colour codes and turn CRLF / bare CR (progress bars) into plain newlines."""
    text = _ANSI.sub("", output)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def judge(
    exit_code: int | None,
    output: str,
    *,
    timed_out: bool = False,
    oom_killed: bool = False,
    timeout_s: float | None = None,
    patterns: VerdictPatterns = VerdictPatterns(),
) -> Outcome:
    """Decide good / bad / skip for one run.

    A golden mismatch is bad whatever the exit code (pypto-lib prints and exits in varying order);
    a pass needs both exit 0 and a PASS line, because a crash after the PASS line (or a PASS line
    from a warm-up) must not be mistaken for a healthy commit. Everything else is skip.
    """
    text = clean_output(output)
    metrics = _parse_clean(text)

    if timed_out:
        limit = f" after {_fmt(timeout_s)}s" if timeout_s is not None else ""
        return Outcome(Verdict.SKIP, f"timeout{limit}", metrics)

    # Killed from outside (the OOM killer, SIGKILL): no verdict, as for a timeout, whatever the
    # run printed before; the caller makes it an infrastructure fault.
    if stopped(exit_code, oom_killed=oom_killed):
        return Outcome(Verdict.SKIP, "killed (out of memory?)", metrics)

    bad = patterns.first_bad(text)
    if bad is not None:
        return Outcome(Verdict.BAD, _bad_reason(metrics, text, bad), metrics)

    if exit_code is None:
        return Outcome(Verdict.SKIP, truncate(_with_detail("no exit status", text)), metrics)

    if exit_code == 0:
        if patterns.first_good(text) is not None:
            return Outcome(Verdict.GOOD, "pass", metrics)
        return Outcome(Verdict.SKIP, "exit 0 without a PASS line", metrics)

    head = f"exit {exit_code}"
    name = _signal_name(exit_code)
    if name:
        head += f" ({name})"
    return Outcome(Verdict.SKIP, truncate(_with_detail(head, text)), metrics)


def parse_metrics(output: str) -> dict[str, MetricValue]:
    """Pull the precision figures out of pypto-lib output; every key is optional.

    When several tensors fail, the worst figures are kept: the report wants to show how far off
    the regression is, and the worst tensor is the one a developer will look at first.
    """
    return _parse_clean(clean_output(output))


def _parse_clean(text: str) -> dict[str, MetricValue]:
    metrics: dict[str, MetricValue] = {}
    blocks = 0

    worst_mismatch: tuple[float, int, int, str] | None = None
    for match in _MISMATCH.finditer(text):
        blocks += 1
        bad, total = int(match.group(1)), int(match.group(2))
        ratio = bad / total if total else 0.0
        line = _line_at(text, match.start())
        if worst_mismatch is None or (ratio, bad) > worst_mismatch[:2]:
            worst_mismatch = (ratio, bad, total, line)
    if worst_mismatch is not None:
        ratio, bad, total, line = worst_mismatch
        metrics["mismatched"] = bad
        metrics["total"] = total
        if total:
            metrics["mismatch_ratio"] = ratio
        _put_first(metrics, "rtol", _RTOL, (line, text))
        _put_first(metrics, "atol", _ATOL, (line, text))

    worst_ratio: re.Match[str] | None = None
    for match in _RATIO.finditer(text):
        blocks += 1
        if worst_ratio is None or _ratio_key(match) > _ratio_key(worst_ratio):
            worst_ratio = match
    if worst_ratio is not None:
        errors, total, pct, allowed, threshold = worst_ratio.groups()
        metrics["ratio_error_count"] = int(errors)
        metrics["ratio_total"] = int(total)
        if pct is not None:
            metrics["ratio_pct"] = float(pct)
        elif int(total):
            metrics["ratio_pct"] = 100.0 * int(errors) / int(total)
        if allowed is not None:
            metrics["ratio_allowed_pct"] = float(allowed)
        if threshold is not None:
            metrics["ratio_threshold"] = _number(threshold)
        _put_first(metrics, "rtol", _RTOL, (text,))
        _put_first(metrics, "atol", _ATOL, (text,))

    counts = {"mismatch_ratio": blocks, "max_abs_diff": 0, "max_rel_diff": 0}
    worst_abs: tuple[float, str | None, str | None] | None = None
    for match in _MAX_ABS.finditer(text):
        counts["max_abs_diff"] += 1
        value = float(match.group(1))
        if worst_abs is None or _bigger(value, worst_abs[0]):
            worst_abs = (value, match.group(2), match.group(3))
    for match in _NUMPY_MAX_ABS.finditer(text):
        counts["max_abs_diff"] += 1
        value = float(match.group(1))
        if worst_abs is None or _bigger(value, worst_abs[0]):
            worst_abs = (value, None, None)
    if worst_abs is not None:
        value, where, tol = worst_abs
        metrics["max_abs_diff"] = value
        if where is not None:
            metrics["max_abs_diff_at"] = where
        if tol is not None:
            metrics["tol"] = float(tol)

    worst_rel: float | None = None
    for pattern in (_MAX_REL, _NUMPY_MAX_REL):
        for match in pattern.finditer(text):
            counts["max_rel_diff"] += 1
            value = float(match.group(1))
            if worst_rel is None or _bigger(value, worst_rel):
                worst_rel = value
    if worst_rel is not None:
        metrics["max_rel_diff"] = worst_rel

    names = _dedupe(
        [m.group(1) for m in _FAILED_TENSOR.finditer(text)]
        + [
            name.strip().strip("'\"")
            for m in _GOLDEN_LIST.finditer(text)
            for name in m.group(1).split(",")
            if name.strip().strip("'\"")
        ]
    )
    if names:
        metrics["failed_tensors"] = ",".join(names)
    if names or blocks > 1:
        metrics["failed_tensor_count"] = max(len(names), blocks)
    # How many tensors printed each limited figure, so that limits judge a run only when
    # every failing tensor printed one (`Tolerance.reads`); one is the default.
    metrics.update({f"{key}_count": n for key, n in counts.items() if n > 1})

    seconds = _RUN_SECONDS.findall(text)
    if seconds:
        metrics["run_seconds"] = float(seconds[-1])
    return metrics


def _bad_reason(metrics: Mapping[str, MetricValue], text: str, match: re.Match[str]) -> str:
    parts: list[str] = []
    if "mismatched" in metrics and "total" in metrics:
        parts.append(
            f"precision mismatch: {metrics['mismatched']}/{metrics['total']} elements"
            + _abs_suffix(metrics)
        )
    elif "ratio_error_count" in metrics:
        if "ratio_pct" in metrics and "ratio_allowed_pct" in metrics:
            figures = f"{_fmt(metrics['ratio_pct'])}% > {_fmt(metrics['ratio_allowed_pct'])}%"
        else:
            figures = f"{metrics['ratio_error_count']}/{metrics['ratio_total']} elements"
        parts.append(f"ratio_allclose fail: {figures}" + _abs_suffix(metrics))
    elif "max_abs_diff" in metrics:
        parts.append("precision mismatch:" + _abs_suffix(metrics).lstrip(","))
    else:
        parts.append(f"precision mismatch: {_line_at(text, match.start()).strip()}")
    tensors = metrics.get("failed_tensors")
    if isinstance(tensors, str) and tensors:
        shown = tensors.split(",")
        listed = ", ".join(shown[:3]) + (f" +{len(shown) - 3} more" if len(shown) > 3 else "")
        parts.append(f"[{listed}]")
    return truncate(" ".join(parts))


def _abs_suffix(metrics: Mapping[str, MetricValue]) -> str:
    value = metrics.get("max_abs_diff")
    return f", max abs diff {_fmt(value)}" if isinstance(value, float) else ""


def _with_detail(head: str, text: str) -> str:
    detail = _telling_line(text)
    return f"{head}: {detail}" if detail else head


def _telling_line(text: str) -> str:
    """The line a human would quote: the exception of the last traceback, else the last error."""
    lines = text.split("\n")
    tracebacks = list(_TRACEBACK.finditer(text))
    if tracebacks:
        start = text.count("\n", 0, tracebacks[-1].start()) + 1
        for line in lines[start:]:
            if line.strip() and not line[0].isspace():
                return line.strip()
    for line in reversed(lines):
        if _ERRORISH.search(line):
            return line.strip()
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""


def _signal_name(exit_code: int) -> str:
    if 128 < exit_code < 128 + 65:
        try:
            return signal.Signals(exit_code - 128).name
        except ValueError:
            return ""
    return ""


def _ratio_key(match: re.Match[str]) -> tuple[float, int]:
    errors, total = int(match.group(1)), int(match.group(2))
    pct = float(match.group(3)) if match.group(3) is not None else 0.0
    if pct != pct:
        pct = float("inf")
    return (max(pct, 100.0 * errors / total if total else 0.0), errors)


def _bigger(value: float, current: float) -> bool:
    """NaN counts as the worst possible difference: a NaN output is the loudest regression."""
    if current != current:
        return False
    return value != value or value > current


def _put_first(
    metrics: dict[str, MetricValue], key: str, pattern: re.Pattern[str], texts: tuple[str, ...]
) -> None:
    if key in metrics:
        return
    for text in texts:
        match = pattern.search(text)
        if match:
            metrics[key] = float(match.group(1))
            return


def _line_at(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end != -1 else len(text)]


def _number(literal: str) -> int | float:
    return int(literal) if re.fullmatch(r"[-+]?\d+", literal) else float(literal)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _fmt(value: MetricValue | None) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def truncate(text: str, limit: int = _REASON_LIMIT) -> str:
    """The text on one line, cut to `limit` characters with "..." where it was cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


# Faults of the machine, not of the commit: a run that hits one is retried, never recorded.
_DEVICE_FAULT = re.compile(
    r"aclInit\b.*(fail|error)|(fail|error).*\baclInit\b|rtSetDevice.*(fail|error)"
    r"|device or resource busy|device is busy|drvError|halGetDeviceInfo.*fail"
    r"|/dev/davinci\d+\b.*(not found|no such|not a character device|permission denied)"
    r"|no space left on device",
    re.IGNORECASE,
)


def stopped(
    exit_code: int | None, *, timed_out: bool = False, oom_killed: bool = False
) -> str | None:
    """Why the run was stopped from outside (the timeout, the OOM killer), or None: the run's
    own doing at this commit, which any card would see the same."""
    if timed_out:
        return "timed out"
    if oom_killed or exit_code == 137:
        return "was killed (out of memory?)"
    return None


def infrastructure_fault(
    exit_code: int | None, output: str, *, timed_out: bool = False, oom_killed: bool = False
) -> str | None:
    """Why a run that gave no verdict says nothing about the commit, or None if it may.

    Timeouts, OOM kills, a full disk and a missing, busy or failing device (aclInit, driver) are
    infrastructure; compile errors and crashes of the example itself stay untestable (skip).
    """
    why = stopped(exit_code, timed_out=timed_out, oom_killed=oom_killed)
    if why is not None:
        return why
    text = clean_output(output)
    found = _DEVICE_FAULT.search(text)
    if found:
        # The whole line: the match alone can miss what failed ("[ERROR] aclInit" without the
        # "/dev/davinci1 not found" after it).
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.end())
        line = text[start : len(text) if end < 0 else end].strip()
        return f"hit a device or machine fault ({truncate(line)})"
    return None
