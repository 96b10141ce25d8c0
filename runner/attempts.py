"""One attempt: export sources, build or reuse the wheels, layer the image, run, judge, record.

This is the only place where the pieces that touch git, the cache and Docker meet; it decides
nothing about the bisect, it only answers "what does this (pypto, simpler) pair give?".
"""

from __future__ import annotations

import contextlib
import time
import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import docker

from runner.builders import Builder
from runner.devices import Passthrough
from runner.errors import InfrastructureError, SourceUnavailable
from runner.execute import ExampleRun, run_example
from runner.images import WheelInstallFailed, ensure_test_image
from runner.ledger import Attempt, Ledger, Level, claim_run_dir
from runner.noop import wheel_content_digest
from runner.search import Verdict
from runner.sources import SourceExporter
from runner.toolchains import Toolchains
from runner.verdict import VerdictPatterns, infrastructure_fault, judge
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
    """Tests (pypto, simpler) pairs in containers and records every attempt in the ledger.

    Infrastructure faults (timeouts, OOM kills, a full disk, engine or device errors) are never
    recorded: the attempt is retried, and after `infra_retries` in a row the run stops (exit 4)
    so that the next run tries again instead of reusing a verdict that says nothing.
    """

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
        toolchains: Toolchains | None = None,
        omit: Collection[str] = (),
        infra_retries: int = 3,
        phase: Phase | None = None,
        echo: Callable[[str], None] | None = None,
        fingerprint: Callable[[str | None], dict[str, str]] | None = None,
    ) -> None:
        self.client = client
        self.fingerprint = fingerprint
        self.ledger = ledger
        self.exporter = exporter
        self.cache = cache
        self.build = build
        self.run = run
        self.workdir = workdir
        self.ccache_dir = ccache_dir
        self.path = submodule_path
        self.toolchains = toolchains
        self.omit = tuple(omit)
        self.infra_retries = max(1, infra_retries)
        self.phase = phase or (lambda _name: None)
        self.echo = echo

    def preflight(self, commits: Sequence[str], gitlinks: Mapping[str, str | None]) -> None:
        """Resolve and download the build tools of the range before the first bisect step."""
        if self.toolchains is not None:
            self.toolchains.plan(commits, gitlinks)

    def _builder(self, package: str, commit: str, at: str | None) -> Builder | None:
        return self.toolchains.builder(package, commit, at) if self.toolchains else None

    def _wheel(
        self,
        package: str,
        commit: str,
        prepare: Callable[[Path], object],
        builder: Builder | None,
    ) -> WheelResult:
        self.phase(f"build {package} {commit[:12]}")
        ccache = self.ccache_dir / package  # one cache per repository, shared by all its builds
        ccache.mkdir(parents=True, exist_ok=True)
        return build_wheel(
            self.client,
            self.cache,
            package,
            commit,
            prepare,
            self.build,
            ccache_dir=ccache,
            builder=builder,
            echo=self.echo,
        )

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        failures: list[str] = []
        while True:
            try:
                return self._attempt(level, pypto, simpler)
            except InfrastructureError as exc:
                reason = str(exc).splitlines()[0]
                failures.append(reason)
                self._note_infrastructure(pypto, simpler, reason)
                if len(failures) >= self.infra_retries:
                    raise InfrastructureError(
                        f"{len(failures)} infrastructure failures in a row, nothing recorded "
                        f"for {pypto[:12]}: {reason}; fix the cause and run again to resume"
                    ) from exc
                if self.echo:
                    self.echo(
                        f"infrastructure failure, not a verdict (try {len(failures)} of "
                        f"{self.infra_retries}): {reason}"
                    )

    def _note_infrastructure(self, pypto: str, simpler: str | None, reason: str) -> None:
        """Kept beside the ledger, never in it: the user may want to know what went wrong."""
        log = self.workdir / "infrastructure.log"
        with contextlib.suppress(OSError), log.open("a") as handle:
            handle.write(f"{_now().isoformat()} {pypto} {simpler or '-'} {reason}\n")

    def _attempt(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        run_id, artifacts = claim_run_dir(
            self.workdir / "runs",
            f"{pypto[:10]}-{(simpler or 'none')[:10]}",
            taken=[attempt.run_id for attempt in self.ledger.document.attempts],
        )
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
        if self.fingerprint is not None:
            record.fingerprint = self.fingerprint(record.image_id)
        record.finished_at = _now()
        self.ledger.record(record)
        return record

    def _build_and_run(self, record: Attempt, artifacts: Path) -> None:
        pypto, simpler = record.pypto_sha, record.simpler_sha
        # Every source this test needs must exist before anything is built for it.
        self.phase("sources")
        overrides: dict[str, str | None] = {self.path: simpler} if simpler is not None else {}
        self.exporter.check(pypto, overrides=overrides, skip=self.omit)
        builders = {"pypto": self._builder("pypto", pypto, None)}
        if simpler is not None:
            builders["simpler"] = self._builder("simpler", simpler, pypto)
        for name, builder in builders.items():
            if builder is not None:
                record.builders[name] = builder.image_id
                record.build_tools[name] = list(builder.resolution.pins)
        wheels: dict[str, WheelResult] = {}
        if simpler is not None:
            wheels["simpler"] = self._wheel(
                "simpler",
                simpler,
                lambda dest: self.exporter.export_submodule(self.path, simpler, dest, at=pypto),
                builders["simpler"],
            )
        if simpler is None or wheels["simpler"].ok:
            wheels["pypto"] = self._wheel(
                "pypto",
                pypto,
                lambda dest: self.exporter.export(pypto, dest, skip=self.omit),
                builders["pypto"],
            )
        for name, wheel in wheels.items():
            record.builds[name] = _build_state(wheel)
            record.build_s += wheel.seconds
            record.export_s += wheel.export_s
            if wheel.ccache_hits is not None and wheel.ccache_misses is not None:
                record.ccache[name] = [wheel.ccache_hits, wheel.ccache_misses]
            if wheel.sha256:
                record.wheel_digests[name] = wheel.sha256
            if wheel.ok and wheel.wheel is not None:
                with contextlib.suppress(OSError, zipfile.BadZipFile):
                    record.wheel_contents[name] = wheel_content_digest(wheel.wheel)
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
            pip_wheel=builders["pypto"].pip_wheel if builders["pypto"] else None,
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
        if outcome.verdict is Verdict.SKIP:
            fault = infrastructure_fault(
                result.exit_code,
                result.output,
                timed_out=result.timed_out,
                oom_killed=result.oom_killed,
            )
            if fault is not None:
                raise InfrastructureError(
                    f"the example run of {pypto[:12]} {fault}; not a verdict (log: "
                    f"{result.log_path})"
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
