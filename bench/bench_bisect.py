"""`make bench`: the manual bisect workflow next to this tool, on one generated history.

The history is shaped like real pypto: 210 first-parent commits with a simpler bump every 15,
each spanning 30 simpler commits, the regression inside one bump, both packages C/C++ built by
scikit-build-core and CMake. The C++ unit each commit changes takes seconds to compile, as real
pypto's do (`--compile-work`), and the example waits for the "card" about as long as an
incremental build takes (a sleep, so the CPUs stay free, as on an NPU host). In one go and on
the same base image it runs:

(a) the manual workflow (`bench/manual/`): one container, ccache on, `git bisect run` on pypto
    with `git submodule update --init runtime` and `pip install --no-build-isolation -e` of both
    packages at every step, then a second `git bisect run` in simpler with pypto pinned;
(b) the tool with one device; (c) the tool with two devices, both on the simulator platform;

and prints tests, rounds, builds per package, ccache hit rate, wheel-cache hits, wall time and
the ratios to (a). It exits 1 when the three do not name the same culprits (or miss the known
one), and prints figures only: no timing is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import docker

from runner.sample.demo import checkout_wheelhouse
from runner.sample.histories import Sample, SampleSpec, make_sample, spread_bumps
from runner.sample.packages import EXAMPLE_PATH

ROOT = Path(__file__).resolve().parents[1]
MANUAL = Path(__file__).resolve().parent / "manual"
LABEL = "bisect-precision-docker"
PLATFORM = "a2a3sim"

BUMP_EVERY, BUMP_SPAN, BUMPS = 15, 30, 14
REGRESSED_BUMP = 8  # the ninth bump (pypto index 135) carries the regression
# Compile-time work in each commit's changed C++ unit (runner.sample.packages.COMPILE_UNIT each):
# about 3 s of one core here, so an incremental build (configure, that unit, link, the wheel)
# is about as long as the example's wait, as the model of an NPU host asks.
COMPILE_WORK = 6
EXAMPLE_SECONDS = 5.0


def bench_spec(example_seconds: float, compile_work: int) -> SampleSpec:
    bumps = spread_bumps(first_at=BUMP_EVERY, every=BUMP_EVERY, count=BUMPS, span=BUMP_SPAN)
    old = bumps[REGRESSED_BUMP - 1][1]
    return SampleSpec(
        pypto_commits=BUMPS * BUMP_EVERY,
        simpler_commits=BUMPS * BUMP_SPAN,
        runtime_added_at=3,
        runtime_initial=0,
        bumps=bumps,
        simpler_regression_at=old + 17,
        native=True,
        pypto_new_era_at=0,
        simpler_new_era_at=0,
        example_seconds=example_seconds,
        compile_work=compile_work,
    )


Interval = tuple[float, float]  # (start, end), seconds since the epoch


@dataclass
class Figures:
    name: str
    tests: int = 0
    rounds: int = 0
    builds: dict[str, int] = field(default_factory=lambda: {"pypto": 0, "simpler": 0})
    untested_builds: int = 0  # wheels built ahead that no test used
    ccache_hits: int = 0
    ccache_misses: int = 0
    cache_hits: int | None = None
    wall_s: float = 0.0
    builds_at: list[Interval] = field(default_factory=list)
    runs_at: list[Interval] = field(default_factory=list)
    incremental_pypto_s: list[float] = field(default_factory=list)
    culprits: tuple[str | None, str | None] = (None, None)
    notes: list[str] = field(default_factory=list)

    @property
    def hit_rate(self) -> str:
        total = self.ccache_hits + self.ccache_misses
        return f"{self.ccache_hits / total:.0%} ({self.ccache_hits}/{total})" if total else "-"

    @property
    def build_s(self) -> float:
        return sum(end - start for start, end in self.builds_at)

    @property
    def run_s(self) -> float:
        return sum(end - start for start, end in self.runs_at)

    @property
    def idle_s(self) -> float:
        """Wall time with no wheel build and no example running: the workflow's own overhead
        (planning, exports, test images, container starts, git, start-up)."""
        return max(0.0, self.wall_s - _covered(self.builds_at + self.runs_at))


def _covered(intervals: list[Interval]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


# --- (a) the manual workflow ------------------------------------------------------------------


def _archive(sample: Sample) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(sample.pypto, arcname="ws/pypto")
        tar.add(sample.lib, arcname="ws/pypto-lib")
        for script in sorted(MANUAL.glob("*.sh")):
            tar.add(script, arcname=f"bench/manual/{script.name}")
    return buffer.getvalue()


def run_manual(
    client: docker.DockerClient, sample: Sample, base_image: str, wheelhouse: Path, log: Path
) -> Figures:
    """One container, no network, the checkout copied in; it finds the culprits by itself."""
    good, bad = sample.pypto_shas[0], sample.pypto_shas[-1]
    container = client.containers.create(
        base_image,
        command=["sh", "/bench/manual/bisect.sh"],
        environment={
            "GOOD": good,
            "BAD": bad,
            "SCRIPT": EXAMPLE_PATH,
            "PLATFORM": PLATFORM,
            "DEVICE": "0",
        },
        network_mode="none",
        labels={LABEL: "1", f"{LABEL}.kind": "bench-manual"},
        volumes={str(wheelhouse): {"bind": "/wheelhouse", "mode": "ro"}},
        working_dir="/ws",
    )
    try:
        started = time.perf_counter()
        container.put_archive("/", _archive(sample))
        container.start()
        status = container.wait(timeout=7200)
        wall = time.perf_counter() - started
        output = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    log.write_text(output)
    if status.get("StatusCode") != 0:
        tail = "\n".join(output.splitlines()[-30:])
        raise SystemExit(f"the manual workflow failed (exit {status.get('StatusCode')}):\n{tail}")
    return parse_manual(output, wall)


def parse_manual(output: str, wall: float) -> Figures:
    figures = Figures("(a) manual: git bisect run + pip -e", wall_s=wall)
    culprits: dict[str, str] = {}
    build: tuple[str, float] | None = None
    run_start = 0.0
    for line in output.splitlines():
        if not line.startswith("BENCH "):
            continue
        word = line.split()
        kind = word[1]
        timed = kind.startswith(("build-", "run-", "phase"))
        stamp = float(word[-1]) if timed else 0.0
        if kind == "build-start":
            build = (word[2], stamp)
            figures.builds[word[2]] += 1
        elif kind in ("build-end", "build-failed") and build is not None:
            figures.builds_at.append((build[1], stamp))
            if build[0] == "pypto" and kind == "build-end":
                figures.incremental_pypto_s.append(stamp - build[1])
            build = None
        elif kind == "run-start":
            run_start = stamp
            figures.tests += 1
        elif kind == "run-end":
            figures.runs_at.append((run_start, stamp))
        elif kind == "culprit":
            culprits[word[2]] = word[3]
        elif kind == "ccache":
            if word[2] == "cache_miss":
                figures.ccache_misses += int(word[3])
            else:
                figures.ccache_hits += int(word[3])
    figures.incremental_pypto_s = figures.incremental_pypto_s[1:]  # the first one is cold
    figures.rounds = figures.tests
    figures.culprits = (culprits.get("pypto"), culprits.get("simpler"))
    return figures


# --- (b), (c) the tool -----------------------------------------------------------------------


def tool_command(
    sample: Sample, base_image: str, wheelhouse: Path, workdir: Path, cache: Path, devices: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--pypto",
        str(sample.pypto),
        "--lib",
        str(sample.lib),
        "--script",
        EXAMPLE_PATH,
        "--good",
        sample.pypto_shas[0],
        "--bad",
        sample.pypto_shas[-1],
        "--platform",
        PLATFORM,
        "--device",
        devices,
        "--base-image",
        base_image,
        "--wheelhouse",
        str(wheelhouse),
        "--workdir",
        str(workdir),
        "--cache-dir",
        str(cache),
        "--timeout",
        "600",
    ]


def run_tool(name: str, command: list[str], workdir: Path, cache: Path, log: Path) -> Figures:
    started = time.perf_counter()
    with log.open("w") as out:
        completed = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{name} exited {completed.returncode}:\n{tail}")
    return parse_tool(name, workdir, cache, wall)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_tool(name: str, workdir: Path, cache: Path, wall: float) -> Figures:
    """Tests and rounds from the ledger; builds from the session's (fresh) wheel cache, which
    holds every wheel built, ahead of need included, with its build container's duration."""
    ledger = json.loads((workdir / "ledger.json").read_text())
    report = json.loads((workdir / "report.json").read_text())
    attempts = ledger["attempts"]
    entries = [json.loads(e.read_text()) for e in (cache / "wheels").glob("*/*/entry.json")]
    used = {d for a in attempts for d in a["wheel_digests"].values()}
    rounds = {(a["level"], a["round"]) for a in attempts if a.get("round") is not None}
    simpler = report.get("simpler") or {}
    figures = Figures(
        name,
        tests=len(attempts),
        rounds=len(rounds) if rounds else len(attempts),
        cache_hits=report["stats"]["cache_hits"],
        wall_s=wall,
        culprits=(report["pypto"]["first_bad"], simpler.get("culprit")),
    )
    for entry in entries:
        figures.builds[entry["package"]] = figures.builds.get(entry["package"], 0) + 1
        figures.untested_builds += entry.get("sha256") not in used
        end = _stamp(entry["created"])
        figures.builds_at.append((end - entry["seconds"], end))
        hits, misses = entry.get("ccache") or (0, 0)
        figures.ccache_hits += hits
        figures.ccache_misses += misses
        if entry["package"] == "pypto" and hits:  # not a cold build
            figures.incremental_pypto_s.append(entry["seconds"])
    for attempt in attempts:
        end = _stamp(attempt["finished_at"])
        figures.runs_at.append((end - attempt["run_s"], end))
    if not rounds:
        figures.notes.append("no `round` in the ledger: rounds counted as tests")
    tested = {a["simpler_sha"] for a in attempts if a.get("simpler_sha")}
    built = {e["commit"] for e in entries if e["package"] == "simpler"}
    figures.notes.append(
        f"simpler: {figures.builds.get('simpler', 0)} builds, {len(tested)} distinct SHAs "
        f"tested, {len(built - tested)} built but never tested"
    )
    return figures


def remove_test_images(client: docker.DockerClient, cache: Path) -> int:
    """The test images this session layered (their wheels are in its fresh cache), then the
    shared layers they were made on: the engine is shared, so only those, never
    `cleanup --images`."""
    digests = set()
    for entry in (cache / "wheels").glob("*/*/entry.json"):
        data = json.loads(entry.read_text())
        if data.get("sha256"):
            digests.add(data["sha256"])
    removed = 0
    for wheel_label in (f"{LABEL}.pypto-wheel", f"{LABEL}.layer-wheel"):
        for image in client.images.list(filters={"label": wheel_label}):
            if image.labels.get(wheel_label) in digests:
                try:
                    client.images.remove(image.id, force=True)
                    removed += 1
                except docker.errors.APIError:
                    pass  # in use or already gone
    return removed


def resume_check(command: list[str], workdir: Path, cache: Path, log: Path) -> str:
    """Run the finished session again: it must build nothing and test nothing new."""
    before = json.loads((workdir / "ledger.json").read_text())["attempts"]
    wheels = len(list((cache / "wheels").glob("*/*/entry.json")))
    started = time.perf_counter()
    with log.open("w") as out:
        completed = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = json.loads((workdir / "ledger.json").read_text())["attempts"]
    built = len(list((cache / "wheels").glob("*/*/entry.json"))) - wheels
    return (
        f"resumed run: exit {completed.returncode}, {wall:.1f} s, "
        f"{len(after) - len(before)} new tests, {built} wheels built"
    )


# --- the table ---------------------------------------------------------------------------------


def table(results: list[Figures], baseline: Figures | None) -> str:
    def ratio(f: Figures) -> str:
        if baseline is None or f is baseline:
            return "-"
        return f"{f.wall_s / baseline.wall_s:.2f}"

    rows = [
        ("tests", lambda f: str(f.tests)),
        ("rounds", lambda f: str(f.rounds)),
        ("pypto builds", lambda f: str(f.builds.get("pypto", 0))),
        ("simpler builds", lambda f: str(f.builds.get("simpler", 0))),
        ("ccache hit rate", lambda f: f.hit_rate),
        ("wheel-cache hits", lambda f: "-" if f.cache_hits is None else str(f.cache_hits)),
        ("builds never tested", lambda f: str(f.untested_builds)),
        ("wheel builds, s (summed)", lambda f: f"{f.build_s:.0f}"),
        ("example runs, s (summed)", lambda f: f"{f.run_s:.0f}"),
        ("idle: no build, no run, s", lambda f: f"{f.idle_s:.0f}"),
        ("idle per round, s", lambda f: f"{f.idle_s / max(f.rounds, 1):.1f}"),
        ("wall time, s", lambda f: f"{f.wall_s:.0f}"),
        ("wall / (a)", ratio),
        ("pypto culprit", lambda f: (f.culprits[0] or "-")[:12]),
        ("simpler culprit", lambda f: (f.culprits[1] or "-")[:12]),
    ]
    lines = ["| | " + " | ".join(f.name for f in results) + " |"]
    lines.append("|---" * (len(results) + 1) + "|")
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(f) for f in results) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {platform.platform()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bisect-precision-test-base:bookworm")
    parser.add_argument("--wheelhouse", type=Path, default=checkout_wheelhouse())
    parser.add_argument(
        "--example-seconds",
        type=float,
        default=EXAMPLE_SECONDS,
        help="how long the example waits for the card (≈ an incremental sample pypto build)",
    )
    parser.add_argument(
        "--compile-work",
        type=int,
        default=COMPILE_WORK,
        help="compile-time work in each commit's changed C++ unit (0: the unit compiles at once)",
    )
    parser.add_argument(
        "--only", default="a,b,c", help="which of a (manual), b (1 device), c (2 devices)"
    )
    parser.add_argument("--keep", type=Path, help="keep everything in this directory")
    parser.add_argument(
        "--tool-arg",
        action="append",
        default=[],
        help="an extra flag for the tool's runs (b) and (c), e.g. --tool-arg=--no-prefetch",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    wheelhouse = args.wheelhouse.resolve()
    if not wheelhouse.is_dir():
        print(f"no wheelhouse at {wheelhouse}: run `make wheelhouse` first", file=sys.stderr)
        return 2
    client = docker.from_env()
    base_id = client.images.get(args.base_image).id
    print(f"machine: {machine()}")
    print(f"base image: {args.base_image} ({base_id[:19]})")

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        scratch = None
        root = args.keep.resolve()
    else:
        scratch = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="bench-bisect-")
        root = Path(scratch.name)
    try:
        spec = bench_spec(args.example_seconds, args.compile_work)
        started = time.perf_counter()
        sample = make_sample(root / "repos", spec)
        expected = sample.expected_first_bad()
        assert expected is not None and expected.simpler_sha is not None
        print(
            f"history: {spec.pypto_commits + 1} pypto commits, {len(spec.bumps)} simpler bumps "
            f"every {BUMP_EVERY} spanning {BUMP_SPAN} simpler commits each, made in "
            f"{time.perf_counter() - started:.1f} s; the regression is simpler "
            f"{expected.simpler_sha[:12]} inside the bump at pypto {expected.pypto_sha[:12]}; "
            f"the example waits {args.example_seconds:g} s; each commit's changed C++ unit "
            f"costs {args.compile_work} compile-work units",
            flush=True,
        )
        results: list[Figures] = []
        baseline = None
        if "a" in only:
            print("(a) the manual workflow ...", flush=True)
            baseline = run_manual(client, sample, args.base_image, wheelhouse, root / "a.log")
            results.append(baseline)
            print(f"    {baseline.wall_s:.0f} s", flush=True)
        for key, name, devices in (
            ("b", "(b) tool, 1 device", "0"),
            ("c", "(c) tool, 2 devices", "0,1"),
        ):
            if key not in only:
                continue
            print(f"{name} ...", flush=True)
            workdir, cache = root / f"{key}-workdir", root / f"{key}-cache"
            command = tool_command(sample, args.base_image, wheelhouse, workdir, cache, devices)
            command += args.tool_arg
            if args.tool_arg:
                name += " " + " ".join(args.tool_arg)
            figures = run_tool(name, command, workdir, cache, root / f"{key}.log")
            if key == "b":
                figures.notes.append(
                    resume_check(command, workdir, cache, root / f"{key}-resume.log")
                )
            results.append(figures)
            removed = remove_test_images(client, cache)
            print(f"    {figures.wall_s:.0f} s ({removed} test images removed)", flush=True)

        print()
        print(table(results, baseline))
        print()
        for figures in results:
            for note in figures.notes:
                print(f"{figures.name}: {note}")
            incremental = _median(figures.incremental_pypto_s)
            if incremental is not None:
                print(
                    f"{figures.name}: incremental pypto build (warm ccache), median "
                    f"{incremental:.1f} s of {len(figures.incremental_pypto_s)}"
                )
        wanted = (expected.pypto_sha, expected.simpler_sha)
        wrong = [f.name for f in results if f.culprits != wanted]
        if wrong:
            print(
                f"culprits differ from pypto {wanted[0][:12]} / simpler {wanted[1][:12]}: "
                + ", ".join(wrong),
                file=sys.stderr,
            )
            return 1
        print(f"all name pypto {wanted[0][:12]} and simpler {wanted[1][:12]}")
        return 0
    finally:
        if scratch is not None:
            scratch.cleanup()


if __name__ == "__main__":
    sys.exit(main())
