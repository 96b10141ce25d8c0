"""The tool's own per-step overhead on a warm cache, next to the pip build and the example run.

Steps: provision a builder (resolve and download the build tools, layer the builder image; then
reuse it), export a commit's sources, layer a test image from cached wheels (new and reused),
start and remove a container; and native builds: a cold C/C++ wheel next to its neighbour with a
warm ccache. Target for the tool's own steps: each under 2 s on a 2-core machine (a new builder
image is a one-off per build-tool set). Prints figures side by side.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import docker

from runner.builders import PackageSources, Provisioner
from runner.containers import ContainerSpec
from runner.devices import passthrough
from runner.execute import LABEL, ExampleRun, connect, run_container, run_example
from runner.images import ensure_test_image
from runner.sample.demo import checkout_wheelhouse
from runner.sample.histories import SampleSpec, make_sample
from runner.sources import SourceExporter
from runner.wheels import BuildSettings, WheelCache, build_wheel


def measure(action: Callable[[int], object], repeats: int) -> list[float]:
    times = []
    for index in range(repeats):
        started = time.perf_counter()
        action(index)
        times.append(time.perf_counter() - started)
    return times


def native_builds(
    client: docker.DockerClient, provisioner: Provisioner, root: Path, repeats: int
) -> list[tuple[str, str, list[float]]]:
    """Neighbouring native commits: the first compiles everything, the next hits ccache."""
    native = make_sample(root / "native", SampleSpec(native=True, pypto_new_era_at=1))
    exporter = SourceExporter(native.pypto, root / "native-cache")
    cache = WheelCache(root / "native-cache" / "wheels")
    shas = native.pypto_shas[-repeats - 1 :]
    pyproject, when = exporter.read(shas[0], "pyproject.toml")
    builder = provisioner.builder(provisioner.resolve("pypto", shas[0], pyproject, when), "bench")
    settings = BuildSettings(base_image=builder.image_id, base_image_id=builder.image_id)
    ccache = root / "native-cache" / "ccache"
    results = [
        build_wheel(
            client,
            cache,
            "pypto",
            sha,
            lambda d, sha=sha: exporter.export(sha, d),
            settings,
            ccache_dir=ccache,
            builder=builder,
        )
        for sha in shas
    ]
    hits = sum(r.ccache_hits or 0 for r in results[1:])
    total = sum((r.ccache_hits or 0) + (r.ccache_misses or 0) for r in results[1:])
    return [
        ("native wheel (cold ccache)", "build", [results[0].seconds]),
        (f"native wheel (warm, {hits}/{total} hits)", "build", [r.seconds for r in results[1:]]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="bisect-precision-test-base:bookworm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wheelhouse", type=Path, default=checkout_wheelhouse())
    args = parser.parse_args()
    client = connect()
    rows: list[tuple[str, str, list[float]]] = []

    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        provisioner = Provisioner(
            client,
            base_image_id=client.images.get(args.base_image).id,
            cache_root=root / "cache",
            sources=PackageSources(wheelhouse=args.wheelhouse),
        )
        setuptools = provisioner.resolve("pypto", "0" * 40, None, datetime.now(timezone.utc))
        started = time.perf_counter()
        builder = provisioner.builder(setuptools, "bench")
        first = time.perf_counter() - started
        label = "builder image (new)" if builder.built else "builder image (found)"
        rows.append((label, "once", [first]))
        rows.append(
            (
                "builder image (reused)",
                "tool",
                measure(lambda i: provisioner.builder(setuptools, "bench"), args.repeats),
            )
        )
        base_id = builder.image_id
        settings = BuildSettings(base_image=args.base_image, base_image_id=base_id)
        rows += native_builds(client, provisioner, root, args.repeats)
        sample = make_sample(root / "sample", SampleSpec())
        exporter = SourceExporter(sample.pypto, root / "cache")
        cache = WheelCache(root / "cache" / "wheels")
        ccache = root / "cache" / "ccache"
        pypto_shas = sample.pypto_shas[-args.repeats - 1 :]
        simpler = sample.gitlink(len(sample.pypto_shas) - 1)

        def export(index: int) -> None:
            exporter.export(pypto_shas[index], root / f"export-{index}")

        exporter.export(pypto_shas[-1], root / "warm-up")
        rows.append(("export (warm mirror)", "tool", measure(export, args.repeats)))

        def wheel(package: str, sha: str, prepare: Callable[[Path], object]):
            return build_wheel(client, cache, package, sha, prepare, settings, ccache_dir=ccache)

        simpler_wheel = wheel(
            "simpler",
            simpler,
            lambda d: exporter.export_submodule("runtime", simpler, d, at=pypto_shas[-1]),
        )
        builds = []
        pypto_wheels = {}
        for sha in pypto_shas:
            result = wheel("pypto", sha, lambda d, sha=sha: exporter.export(sha, d))
            builds.append(result.seconds)
            pypto_wheels[sha] = result
        rows.append(("pip wheel build (cold, pypto)", "build", builds))
        rows.append(
            (
                "wheel from the cache",
                "tool",
                measure(lambda i: wheel("pypto", pypto_shas[i], lambda d: None), args.repeats),
            )
        )

        images = {}

        def layer(index: int) -> None:
            sha = pypto_shas[index]
            images[sha] = ensure_test_image(
                client,
                base_image=args.base_image,
                base_image_id=base_id,
                pypto_sha=sha,
                pypto_wheel=pypto_wheels[sha].wheel,
                simpler_sha=simpler,
                simpler_wheel=simpler_wheel.wheel,
                log_path=root / f"image-{index}.log",
            )

        rows.append(("image layering (new image)", "tool", measure(layer, args.repeats)))
        rows.append(("image layering (reused)", "tool", measure(layer, args.repeats)))

        def container(index: int) -> None:
            run_container(
                client,
                ContainerSpec(image=args.base_image, command=["true"]),
                log_path=root / f"true-{index}.log",
            )

        rows.append(("container start + removal", "tool", measure(container, args.repeats)))

        devices = passthrough("explicit", "a2a3", ["0"], ["/dev/null:/dev/davinci0"])

        def example(index: int) -> None:
            image = images[pypto_shas[index]]
            run_example(
                client,
                ExampleRun(
                    image=image.image_id,
                    lib_dir=sample.lib,
                    script=sample.script,
                    platform="a2a3",
                    device="0",
                    artifacts_dir=root / f"run-{index}",
                    passthrough=devices,
                ),
            )

        rows.append(("example run (incl. container)", "run", measure(example, args.repeats)))
        for image in client.images.list(filters={"label": f"{LABEL}=1"}):
            if any(image.id == made.image_id for made in images.values()):
                client.images.remove(image.id, force=True)

    print(f"{'step':34} {'kind':6} {'median s':>9} {'min s':>7} {'max s':>7}  target")
    for name, kind, times in rows:
        target = "< 2 s" if kind == "tool" else ""  # "once": per build-tool set, not per step
        flag = "" if kind != "tool" or statistics.median(times) < 2 else "  OVER"
        print(
            f"{name:34} {kind:6} {statistics.median(times):9.3f} {min(times):7.3f} "
            f"{max(times):7.3f}  {target}{flag}"
        )


if __name__ == "__main__":
    main()
