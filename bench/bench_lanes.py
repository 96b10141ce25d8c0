"""`make bench`: two simulator lanes against one on small two-level histories, as a new user runs.

The throughput target for several devices: on the simulator, `--device 0,1` names the same
culprits as `--device 0` in at most 0.7 of its wall time. `bench_bisect` measures that on its
long history with a slow example; this runs the CLI, exactly as a user would, on a small history
of the shape the end-to-end tests use (40 pypto commits, a pointer-only bump and a bump with
code, the regression in a simpler commit inside the first), once with pure-Python packages and
once with the native C/C++ sample, each lane count with a fresh workdir and wheel cache. It
prints tests, rounds, wall time and the ratio; it asserts no timing.

    python -m bench.bench_lanes [--only python,native] [--repeat N] [--tool-arg=--flag=value]

Each lane count runs `--repeat` times (default 2, alternating), since one run on a shared 2-core
machine varies by a few seconds; the table shows every wall time and the ratio of their means.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

from bench.bench_bisect import machine, remove_test_images
from runner.sample.demo import checkout_wheelhouse, on_simulator, run_arguments
from runner.sample.histories import Sample, SampleSpec, make_sample

ROOT = Path(__file__).resolve().parents[1]


def spec(native: bool) -> SampleSpec:
    return SampleSpec(
        pypto_commits=40,
        simpler_commits=24,
        runtime_added_at=1,
        runtime_initial=0,
        bumps=((14, 12), (27, 23)),
        simpler_regression_at=7,
        native=native,
        pypto_new_era_at=0,  # today's build configuration throughout, as in bench_bisect
        simpler_new_era_at=0,
    )


def run(
    root: Path, name: str, lanes: str, base_image: str, sample: Sample, extra: list[str]
) -> dict[str, object]:
    workdir, cache = root / f"{name}-work", root / f"{name}-cache"
    arguments = run_arguments(
        pypto=sample.pypto,
        lib=sample.lib,
        good=sample.pypto_shas[0],
        workdir=workdir,
        cache=cache,
        base_image=base_image,
        wheelhouse=checkout_wheelhouse(),
    )
    args = [*on_simulator(arguments, lanes), *extra]
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "runner.cli", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    remove_test_images(docker.from_env(), cache)
    if completed.returncode != 0:
        raise SystemExit(f"{name} exited {completed.returncode}:\n{completed.stderr[-3000:]}")
    report = json.loads(completed.stdout)
    attempts = json.loads((workdir / "ledger.json").read_text())["attempts"]
    return {
        "wall": wall,
        "tests": len(attempts),
        "rounds": len({(a["level"], a.get("round")) for a in attempts}),
        "culprits": (report["pypto"]["first_bad"], (report.get("simpler") or {}).get("first_bad")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bisect-precision-test-base:bookworm")
    parser.add_argument("--only", default="python,native")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--tool-arg",
        action="append",
        default=[],
        help="an extra flag for every run, e.g. --tool-arg=--build-jobs=3",
    )
    args = parser.parse_args()
    print(f"machine: {machine()}")
    failed = False
    rows = []
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="bench-lanes-") as scratch:
        for kind in args.only.split(","):
            root = Path(scratch) / kind
            sample = make_sample(root / "sample", spec(native=kind == "native"))
            ones, twos = [], []
            for r in range(args.repeat):
                ones.append(run(root, f"one-{r}", "0", args.base_image, sample, args.tool_arg))
                twos.append(run(root, f"two-{r}", "0,1", args.base_image, sample, args.tool_arg))
            same = all(x["culprits"] == ones[0]["culprits"] for x in [*ones, *twos])
            failed |= not same
            rows.append((kind, ones, twos, same))
    print()
    print("| history | lanes | tests | rounds | wall, s | mean, s | (two)/(one) | same culprits |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, ones, twos, same in rows:
        means = [sum(float(x["wall"]) for x in runs) / len(runs) for runs in (ones, twos)]  # type: ignore[arg-type]
        for lanes, runs, mean in ((1, ones, means[0]), (2, twos, means[1])):
            walls = ", ".join(f"{float(x['wall']):.1f}" for x in runs)  # type: ignore[arg-type]
            tests = "/".join(sorted({str(x["tests"]) for x in runs}))
            rounds = "/".join(sorted({str(x["rounds"]) for x in runs}))
            ratio = f"{means[1] / means[0]:.2f}" if lanes == 2 else ""
            culprits = ("yes" if same else "NO") if lanes == 2 else ""
            print(
                f"| {kind} | {lanes} | {tests} | {rounds} | {walls} | {mean:.1f} | {ratio} | "
                f"{culprits} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
