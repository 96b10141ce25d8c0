"""One attempt: export sources, build or reuse the wheels, layer the image, run, judge, record.

This is the only place where the pieces that touch git, the cache and Docker meet; it decides
nothing about the bisect, it only answers "what does this (pypto, simpler) pair give?".
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import docker

from runner.devices import Passthrough
from runner.errors import SourceUnavailable
from runner.execute import ExampleRun, run_example
from runner.images import WheelInstallFailed, ensure_test_image
from runner.ledger import Attempt, Ledger, Level
from runner.search import Verdict
from runner.sources import SourceExporter
from runner.verdict import VerdictPatterns, judge
from runner.wheels import BuildSettings, WheelCache, WheelResult, build_wheel

Phase = Callable[[str], None]


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class RunSettings:
    """How the example runs; everything here is part of the session's identity."""

    lib_dir: Path
    script: str
    platform: str
    device: str
    passthrough: Passthrough
    extra_args: list[str] = field(default_factory=list)
    python: str = "python3"
    environment: dict[str, str] = field(default_factory=dict)
    ptoas_root: Path | None = None
    pto_isa_root: Path | None = None
    cpus: float | None = None
    timeout: float | None = None
    patterns: VerdictPatterns = field(default_factory=VerdictPatterns)


class DockerTester:
    """Tests (pypto, simpler) pairs in containers and records every attempt in the ledger."""

    def __init__(
        self,
        client: docker.DockerClient,
        ledger: Ledger,
        exporter: SourceExporter,
        cache: WheelCache,
        build: BuildSettings,
        run: RunSettings,
        *,
        workdir: Path,
        ccache_dir: Path,
        submodule_path: str = "runtime",
        phase: Phase | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.exporter = exporter
        self.cache = cache
        self.build = build
        self.run = run
        self.workdir = workdir
        self.ccache_dir = ccache_dir
        self.path = submodule_path
        self.phase = phase or (lambda _name: None)
        self.echo = echo

    def _run_id(self, pypto: str, simpler: str | None) -> str:
        number = len(self.ledger.document.attempts) + 1
        return f"{number:03d}-{pypto[:10]}-{(simpler or 'none')[:10]}"

    def _wheel(self, package: str, commit: str, prepare: Callable[[Path], object]) -> WheelResult:
        self.phase(f"build {package} {commit[:12]}")
        self.ccache_dir.mkdir(parents=True, exist_ok=True)
        return build_wheel(
            self.client,
            self.cache,
            package,
            commit,
            prepare,
            self.build,
            ccache_dir=self.ccache_dir,
            echo=self.echo,
        )

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        run_id = self._run_id(pypto, simpler)
        artifacts = self.workdir / "runs" / run_id
        if artifacts.exists():  # left by a run that was killed before it was recorded
            shutil.rmtree(artifacts)
        artifacts.mkdir(parents=True)
        record = Attempt(
            run_id=run_id,
            level=level,
            pypto_sha=pypto,
            simpler_sha=simpler,
            verdict=Verdict.SKIP,
            artifacts_dir=str(artifacts),
            device=self.run.device,
            started_at=_now(),
            finished_at=_now(),
        )
        try:
            self._build_and_run(record, artifacts)
        except (SourceUnavailable, WheelInstallFailed) as exc:
            record.verdict = Verdict.SKIP
            record.reason = str(exc).splitlines()[0]
        record.finished_at = _now()
        self.ledger.record(record)
        return record

    def _build_and_run(self, record: Attempt, artifacts: Path) -> None:
        pypto, simpler = record.pypto_sha, record.simpler_sha
        wheels: dict[str, WheelResult] = {}
        if simpler is not None:
            wheels["simpler"] = self._wheel(
                "simpler",
                simpler,
                lambda dest: self.exporter.export_submodule(self.path, simpler, dest, at=pypto),
            )
        if simpler is None or wheels["simpler"].ok:
            wheels["pypto"] = self._wheel(
                "pypto", pypto, lambda dest: self.exporter.export(pypto, dest)
            )
        for name, wheel in wheels.items():
            record.builds[name] = _build_state(wheel)
            record.build_s += wheel.seconds
            if wheel.sha256:
                record.wheel_digests[name] = wheel.sha256
            if not wheel.ok:
                record.verdict = Verdict.SKIP
                record.reason = f"build failed: {name} ({wheel.reason or 'see the build log'})"
                record.log_path = str(wheel.log_path)
                return

        self.phase("image")
        started = time.monotonic()
        image = ensure_test_image(
            self.client,
            base_image=self.build.base_image,
            base_image_id=self.build.base_image_id,
            pypto_sha=pypto,
            pypto_wheel=wheels["pypto"].wheel,
            simpler_sha=simpler,
            simpler_wheel=wheels["simpler"].wheel if simpler is not None else None,
            log_path=artifacts / "image.log",
            echo=self.echo,
        )
        record.build_s += time.monotonic() - started
        record.image_id = image.image_id

        self.phase("run")
        result = run_example(
            self.client,
            ExampleRun(
                image=image.image_id,
                lib_dir=self.run.lib_dir,
                script=self.run.script,
                platform=self.run.platform,
                device=self.run.device,
                artifacts_dir=artifacts,
                passthrough=self.run.passthrough,
                extra_args=list(self.run.extra_args),
                python=self.run.python,
                environment=dict(self.run.environment),
                ptoas_root=self.run.ptoas_root,
                pto_isa_root=self.run.pto_isa_root,
                cpus=self.run.cpus,
                timeout=self.run.timeout,
            ),
            echo=self.echo,
        )
        outcome = judge(
            result.exit_code,
            result.output,
            timed_out=result.timed_out,
            oom_killed=result.oom_killed,
            timeout_s=self.run.timeout,
            patterns=self.run.patterns,
        )
        record.verdict = outcome.verdict
        record.reason = outcome.reason
        record.metrics = dict(outcome.metrics)
        record.exit_code = result.exit_code
        record.run_s = result.seconds
        record.log_path = str(result.log_path)


def _build_state(wheel: WheelResult) -> str:
    if wheel.ok:
        return "cached" if wheel.from_cache else "built"
    return "failed-cached" if wheel.from_cache else "failed"
