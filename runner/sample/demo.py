"""`make demo`: the main job on the built-in sample.

Generates a small pypto / simpler / pypto-lib history whose regression hides inside a simpler bump,
then runs the real CLI on it with the real Docker Engine, exactly as a user would.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from runner.sample.histories import SampleSpec, make_sample, pypto_date, simpler_date
from runner.sample.packages import EXAMPLE_PATH

DEMO_SPEC = SampleSpec(
    pypto_commits=12,
    simpler_commits=10,
    runtime_added_at=3,
    runtime_initial=2,
    bumps=((6, 6), (9, 8)),
    simpler_regression_at=5,
    native=True,
    pypto_new_era_at=7,
    simpler_new_era_at=4,
)
OLD_BACKEND = "scikit-build-core==0.10.7"


def checkout_wheelhouse() -> Path:
    """The build tools `make setup` downloads into the source checkout (`make wheelhouse`)."""
    return Path(__file__).resolve().parents[2] / ".cache" / "wheelhouse"


def era_pins(spec: SampleSpec) -> list[str]:
    """`--build-pin`s for a wheelhouse without upload times: old-era commits get old tools."""
    pins = []
    for package, at, date_of in (
        ("pypto", spec.pypto_new_era_at, pypto_date),
        ("simpler", spec.simpler_new_era_at, simpler_date),
    ):
        if spec.native and at is not None and at > 0:
            pin = {
                "package": package,
                "until": date_of(at - 1),
                "requirements": [OLD_BACKEND],
            }
            pins += ["--build-pin", json.dumps(pin)]
    return pins


def run_arguments(
    *,
    pypto: Path,
    lib: Path,
    good: str,
    workdir: Path,
    cache: Path,
    base_image: str,
    wheelhouse: Path | None = None,
) -> list[str]:
    """`run` on a sample, NPU mode with /dev/null standing in for /dev/davinci0."""
    wheelhouse = wheelhouse or checkout_wheelhouse()
    provisioning = ["--wheelhouse", str(wheelhouse)] if wheelhouse.is_dir() else []
    return [
        "run",
        *provisioning,
        "--pypto",
        str(pypto),
        "--lib",
        str(lib),
        "--script",
        EXAMPLE_PATH,
        "--good",
        good,
        "--platform",
        "a2a3",
        "--device",
        "0",
        "--device-map",
        "/dev/null:/dev/davinci0",
        "--base-image",
        base_image,
        "--workdir",
        str(workdir),
        "--cache-dir",
        str(cache),
        "--timeout",
        "120",
    ]


def on_simulator(arguments: list[str], lanes: str) -> list[str]:
    """`run_arguments` on the simulator platform with these lanes (`--device`), no device map."""
    out = list(arguments)
    out[out.index("--platform") + 1] = "a2a3sim"
    out[out.index("--device") + 1] = lanes
    at = out.index("--device-map")
    del out[at : at + 2]
    return out


def flaky_example(rate: float, seed: int) -> list[str]:
    """`run` flags that make the sample's example lie at `rate` either way, as golden comparisons
    on hardware do; `seed` and each attempt's run number decide which runs lie."""
    variables = {"SAMPLE_FALSE_FAIL": rate, "SAMPLE_FALSE_PASS": rate, "SAMPLE_FLAKE_SEED": seed}
    return [arg for name, value in variables.items() for arg in ("--run-env", f"{name}={value}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("demo"), help="where to put everything")
    parser.add_argument("--base-image", default="bisect-precision-test-base:bookworm")
    parser.add_argument(
        "--flaky",
        type=float,
        default=0.0,
        metavar="RATE",
        help="the example gives the wrong answer this often, either way (0 to 0.5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="which lies the flaky example tells")
    args = parser.parse_args(argv)
    if not 0 <= args.flaky <= 0.5:
        parser.error(f"--flaky {args.flaky}: give a rate from 0 to 0.5")

    root = args.dir.resolve()
    repos = root / "repos"
    if repos.exists():
        print(f"reusing the sample repositories in {repos}")
        sample = None
    else:
        sample = make_sample(repos, DEMO_SPEC)
        culprit = sample.expected_first_bad()
        assert culprit is not None
        print(
            f"made a sample history in {repos}: {DEMO_SPEC.pypto_commits} pypto commits; "
            f"the regression is simpler commit {culprit.simpler_index} inside the bump at "
            f"pypto commit {culprit.pypto_index}"
        )
    pypto = repos / "pypto"
    good = subprocess.run(
        ["git", "-C", str(pypto), "rev-list", "--max-parents=0", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[0]
    # A flaky run gets its own workdir: its ledger must not mix with the honest example's.
    workdir = root / (f"workdir-flaky-{args.flaky:g}-seed-{args.seed}" if args.flaky else "workdir")
    arguments = run_arguments(
        pypto=pypto,
        lib=repos / "pypto-lib",
        good=good,
        workdir=workdir,
        cache=root / "cache",
        base_image=args.base_image,
    )
    arguments += era_pins(DEMO_SPEC)
    if args.flaky:
        arguments += flaky_example(args.flaky, args.seed)
    command = [sys.executable, "-m", "runner.cli", *arguments]
    print("$ bisect-precision-docker " + " ".join(arguments), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
