"""Did the compiler's output change between the last good and the first bad run?

The answer splits the blame: if the generated kernels differ, pypto (the compiler) made the
regression; if they are byte-for-byte the same after masking timestamps, the runtime (simpler) or
the environment did, whatever commit the bisect landed on. Pure: directories in, data out.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Triage", "compare_generated", "mask_timestamps", "program_name"]

DIFF_LINE_LIMIT = 400
IGNORED_SUFFIXES = frozenset({".o", ".so", ".a", ".bin"})
_SEARCH_DEPTH = 5

_IDENTICAL = "generated code is identical: pointing at the runtime (simpler) or the environment"
_IDENTICAL_SAME_RUNTIME = (
    "generated code is identical and both runs had the same runtime (simpler): pointing at the "
    "environment or a flaky example"
)
_IDENTICAL_SAME_COMPILER = (
    "generated code is identical with the same pypto commit: the runtime (simpler) changed how "
    "it runs"
)

_TIMESTAMP_SUFFIX = re.compile(
    r"_(?:"
    r"\d{8}_\d{6}(?:[_.]\d+)?"  # 20260101_120000, 20260101_120000_123456
    r"|\d{8}T?\d{6}(?:[_.]\d+)?"  # 20260101T120000, 20260101120000
    r"|\d{4}-\d{2}-\d{2}[T_-]\d{2}[-:.]?\d{2}[-:.]?\d{2}(?:[_.]\d+)?"  # 2026-01-01_12-00-00
    r"|\d{9,}(?:[_.]\d+)?"  # 1712345678, 1712345678.123, 1712345678123
    r")$"
)
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"(?<!\d)\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?(?!\d)"
        ),
        "<TIMESTAMP>",
    ),
    (re.compile(r"(?<!\d)\d{8}_\d{6}(?:_\d+)?(?!\d)"), "<TIMESTAMP>"),
    (re.compile(r"(?<![\d:])\d{2}:\d{2}:\d{2}(?:\.\d+)?(?![\d:])"), "<TIME>"),
    (
        re.compile(
            r"(?i)((?:time|stamp|date|built|created|generated|epoch)\w*['\"]?\s*[:=]\s*['\"]?)"
            r"\d{9,}(?:\.\d+)?"
        ),
        r"\1<EPOCH>",
    ),
)


@dataclass(frozen=True)
class Triage:
    """Where the regression lives, judged from generated code; `summary` is one report sentence."""

    status: Literal["changed", "identical", "unavailable"]
    summary: str
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    diff: str = ""


def compare_generated(
    good_artifacts: Path | None,
    bad_artifacts: Path | None,
    *,
    subdirs: Sequence[str] = ("kernels", "ptoas", "orchestration"),
    same_compiler: bool = False,
    same_runtime: bool = False,
) -> Triage:
    """Compare the generated sources of two runs (the last good and the first bad).

    ``same_compiler``: both runs used one pypto commit (the simpler level), so a difference
    is the runtime's doing, not the compiler's. ``same_runtime``: both used one simpler commit
    (or none), so identical code cannot point at the runtime.

    Each argument is a run's artifacts directory; the `build_output` tree is searched for below it,
    so it may be the artifacts dir, its `build_output/`, or the program directory itself. Entries
    of `subdirs` are paths inside a program directory (a file such as `kernel_config.py` works).
    Object files and libraries are ignored: they embed build paths and times and say nothing the
    sources don't.
    """
    good, why = _collect(good_artifacts, "last good", subdirs)
    if good is None:
        return Triage("unavailable", f"no generated code to compare: {why}")
    bad, why = _collect(bad_artifacts, "first bad", subdirs)
    if bad is None:
        return Triage("unavailable", f"no generated code to compare: {why}")

    changed = tuple(sorted(p for p in good.keys() & bad.keys() if good[p] != bad[p]))
    added = tuple(sorted(bad.keys() - good.keys()))
    removed = tuple(sorted(good.keys() - bad.keys()))
    count = len(changed) + len(added) + len(removed)
    if not count:
        if same_runtime and not same_compiler:
            return Triage("identical", _IDENTICAL_SAME_RUNTIME)
        return Triage("identical", _IDENTICAL_SAME_COMPILER if same_compiler else _IDENTICAL)

    files = "file" if count == 1 else "files"
    summary = (
        f"generated code differs in {count} {files} with the same pypto commit: the runtime "
        "(simpler) changes what is generated"
        if same_compiler
        else f"generated code differs in {count} {files}: compiler output changed, pointing at "
        "pypto"
    )
    diff = _unified_diff(good, bad, sorted((*changed, *added, *removed)))
    return Triage("changed", summary, changed, added, removed, diff)


def program_name(directory_name: str) -> str:
    """`DecodeFwd_20260101_120000` -> `DecodeFwd`: runs differ only in when they were built."""
    stripped = _TIMESTAMP_SUFFIX.sub("", directory_name)
    return stripped or directory_name


def mask_timestamps(text: str) -> str:
    """Hide dates, times and build epochs so two builds of the same code compare equal."""
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def _collect(
    artifacts: Path | None, which: str, subdirs: Sequence[str]
) -> tuple[dict[str, str | bytes] | None, str]:
    """Normalised relative path -> masked text (or raw bytes for binaries) of one run's output."""
    if artifacts is None:
        return None, f"the {which} run kept no artifacts"
    artifacts = Path(artifacts)
    if not artifacts.is_dir():
        return None, f"the {which} run's artifacts are missing ({artifacts})"
    programs = _find_programs(artifacts, subdirs)
    if not programs:
        return None, f"the {which} run left no build_output under {artifacts}"

    files: dict[str, str | bytes] = {}
    for name, directory in programs.items():
        prefix = f"{name}/" if name else ""
        for relative in _source_files(directory, subdirs):
            content = _read(directory / relative)
            if isinstance(content, str):
                content = _mask_build_stamp(content, directory.name, name)
            files[f"{prefix}{relative}"] = content
    if not files:
        return None, f"the {which} run's build_output under {artifacts} holds no generated sources"
    return files, ""


def _mask_build_stamp(text: str, directory_name: str, name: str) -> str:
    """Mask the directory's own build stamp wherever it shows up, whatever its shape."""
    if name and directory_name != name:
        text = text.replace(directory_name, name)
        stamp = directory_name[len(name) + 1 :]
        text = text.replace(stamp, "<TIMESTAMP>")
    return mask_timestamps(text)


def _find_programs(artifacts: Path, subdirs: Sequence[str]) -> dict[str, Path]:
    """Program directories by normalised name; of repeats with one name, the latest wins."""
    nested = (Path(d) for d in _walk_dirs(artifacts) if Path(d).name == "build_output")
    for root in itertools.chain((artifacts / "build_output", artifacts), nested):
        if not root.is_dir():
            continue
        found = [root] if _is_program(root, subdirs) else []
        found += [d for d in _children(root) if _is_program(d, subdirs)]
        if found:
            return _by_name(found, artifacts)
    walked = [Path(d) for d in _walk_dirs(artifacts) if _is_program(Path(d), subdirs)]
    return _by_name(walked, artifacts)


def _by_name(directories: list[Path], artifacts: Path) -> dict[str, Path]:
    """Key each program by its name without timestamp.

    The artifacts dir itself may be the program dir; its name is then the run's, not the
    program's, unless it carries a build timestamp, so it gets the empty name.
    """
    programs: dict[str, Path] = {}
    for directory in sorted(directories, key=lambda d: d.name):
        own = directory == artifacts and not _TIMESTAMP_SUFFIX.search(directory.name)
        programs["" if own else program_name(directory.name)] = directory
    return programs


def _is_program(directory: Path, subdirs: Sequence[str]) -> bool:
    return any((directory / sub).exists() for sub in subdirs)


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _walk_dirs(top: Path) -> Iterator[str]:
    base = str(top).rstrip(os.sep).count(os.sep)
    for current, dirs, _files in os.walk(top):
        dirs.sort()
        if current.count(os.sep) - base >= _SEARCH_DEPTH:
            dirs.clear()
        yield current


def _source_files(program: Path, subdirs: Sequence[str]) -> list[str]:
    found: set[str] = set()
    for sub in subdirs:
        target = program / sub
        if target.is_file():
            candidates = [target]
        elif target.is_dir():
            candidates = [
                Path(current, name) for current, _, names in os.walk(target) for name in names
            ]
        else:
            continue
        for path in candidates:
            if path.suffix.lower() in IGNORED_SUFFIXES or path.is_symlink():
                continue
            found.add(path.relative_to(program).as_posix())
    return sorted(found)


def _read(path: Path) -> str | bytes:
    data = path.read_bytes()
    if b"\0" not in data:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return data


def _unified_diff(
    good: dict[str, str | bytes], bad: dict[str, str | bytes], paths: list[str]
) -> str:
    lines: list[str] = []
    for path in paths:
        before, after = good.get(path), bad.get(path)
        if isinstance(before, bytes) or isinstance(after, bytes):
            lines.append(f"Binary files good/{path} and bad/{path} differ")
            continue
        lines.extend(
            line.rstrip("\n")
            for line in difflib.unified_diff(
                (before or "").splitlines(keepends=True),
                (after or "").splitlines(keepends=True),
                fromfile=f"good/{path}" if before is not None else "/dev/null",
                tofile=f"bad/{path}" if after is not None else "/dev/null",
            )
        )
    if len(lines) > DIFF_LINE_LIMIT:
        hidden = len(lines) - DIFF_LINE_LIMIT
        lines = [*lines[:DIFF_LINE_LIMIT], f"... diff truncated: {hidden} more lines not shown"]
    return "\n".join(lines) + "\n" if lines else ""
