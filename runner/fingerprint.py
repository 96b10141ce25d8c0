"""The environment each attempt ran in, and where it changed during a session.

A precision verdict depends on more than the two commits: the base image (its CANN, its torch and
BLAS), the host's NPU driver and firmware, the kernel, the device. A session runs for hours; when
any of those moves in the middle (someone pulls a new base image under the same tag, upgrades the
driver) verdicts on either side are not comparable, and a "culprit" can be the day the environment
changed. So every attempt records a fingerprint, and a change is warned about at once and shown in
the report with the attempts on each side.

`Collector` reads Docker and the host (one probe container per base image, cached); `changes` and
`describe` are pure.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import docker

from runner.containers import ContainerSpec
from runner.execute import KIND_LABEL, run_container
from runner.ledger import Attempt

DRIVER_VERSION = Path("/usr/local/Ascend/driver/version.info")
NPU_SMI = ("npu-smi", "/usr/local/bin/npu-smi")
_MARK = "@@bisect-precision-cann@@"
PROBE = (
    "(python3 -m pip freeze --all 2>/dev/null || python3 -m pip freeze 2>/dev/null) | sort; "
    f"echo {_MARK}; "
    "for f in /usr/local/Ascend/ascend-toolkit/latest/version.cfg "
    "/usr/local/Ascend/ascend-toolkit/latest/*/version.info "
    "/usr/local/Ascend/cann/version.info /etc/ascend_install.info; do "
    '[ -f "$f" ] && { echo "# $f"; cat "$f"; }; done; true'
)
# What a change of each key means, most telling first.
MEANING = {
    "base_image_tag": "the base image tag now names another image (this session keeps building "
    "on the image it started with, so its verdicts still compare)",
    "base_image_id": "the tests ran on another base image",
    "base_image_digest": "the base image's registry digest changed",
    "pip_freeze": "the Python packages of the base image changed",
    "cann": "the CANN toolkit inside the base image changed",
    "driver": "the host's NPU driver changed",
    "npu_smi": "the NPU board summary changed",
    "kernel": "the host kernel changed",
    "device": "another device ran the example",
}


@dataclass(frozen=True)
class Change:
    """Between ``before`` (the last attempt with the old value) and ``after`` (the first with the
    new one), fingerprint ``key`` went from ``old`` to ``new``."""

    key: str
    old: str
    new: str
    before: str  # run id
    after: str  # run id

    @property
    def meaning(self) -> str:
        return MEANING.get(self.key, f"{self.key} changed")


def changes(attempts: Sequence[Attempt]) -> list[Change]:
    """Every change of a fingerprint value between consecutive fingerprinted attempts.

    The test image id is left out: it changes with every tested commit by design. Each node is
    compared with itself (two hosts of a cluster may differ; one host whose driver changed has
    changed). The device is left out for attempts the round scheduler placed (they carry a
    round): which card of the pool runs a test is its choice, not a change of environment.
    """
    found: list[Change] = []
    last: dict[tuple[str, str], tuple[str, str]] = {}  # (node, key) -> (value, run id)
    for attempt in attempts:
        for key, value in attempt.fingerprint.items():
            if key in ("test_image_id", "pip_packages"):
                continue
            if key == "device" and attempt.round is not None:
                continue
            lane = (attempt.node or "", key)
            if lane in last and last[lane][0] != value:
                found.append(Change(key, last[lane][0], value, last[lane][1], attempt.run_id))
            last[lane] = (value, attempt.run_id)
    return found


# Changes that leave what the tests ran on as it was: their verdicts still compare.
HARMLESS = frozenset({"base_image_tag"})


def describe(change: Change) -> str:
    consequence = (
        "the runs on both sides used the same image"
        if change.key in HARMLESS
        else "verdicts on either side may not be comparable"
    )
    return (
        f"{change.meaning}: {change.key} {_short(change.old)} -> {_short(change.new)} between "
        f"runs {change.before} and {change.after}; {consequence}"
    )


def _short(value: str) -> str:
    return value if len(value) <= 40 else value[:37] + "..."


class Collector:
    """Reads one attempt's fingerprint; the probe of a base image runs once per image id."""

    def __init__(
        self, client: docker.DockerClient, base_image: str, device: str, pinned: str | None = None
    ) -> None:
        """`pinned`: the base image id the session builds on (the tag's at its start)."""
        self.client = client
        self.base_image = base_image
        self.pinned = pinned
        self.device = device
        self._lock = threading.Lock()
        self._probes: dict[str, Future[dict[str, str]]] = {}
        self._cancel = threading.Event()
        self._threads: list[threading.Thread] = []

    def prepare(self) -> None:
        """Probe the pinned base image now, in the background, while the first builds run: the
        first attempt would otherwise wait for the probe's container after its own run."""
        if self.pinned is None:
            return
        future, new = self._claim(self.pinned)
        if new:
            thread = threading.Thread(
                target=self._fill, args=(self.pinned, future), name="fingerprint", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Stop a probe still running (its container is killed) and wait for it."""
        self._cancel.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def __call__(self, test_image_id: str | None, device: str = "") -> dict[str, str]:
        facts: dict[str, str] = {}
        try:
            tagged = self.client.images.get(self.base_image).id
        except docker.errors.ImageNotFound:
            tagged = "missing"
        # The image the tests were built on, probed; and apart, what the tag names now.
        used = self.pinned or tagged
        facts["base_image_id"] = used
        facts["base_image_tag"] = tagged
        try:
            base = self.client.images.get(used)
            digests = sorted(base.attrs.get("RepoDigests") or [])
            facts["base_image_digest"] = ",".join(digests) or "none (a local image)"
            facts.update(self._probe(base.id))
        except docker.errors.ImageNotFound:
            facts["base_image_id"] = "missing"
        if test_image_id:
            facts["test_image_id"] = test_image_id
        facts.update(host_facts())
        facts["device"] = device or self.device
        return facts

    def _probe(self, image_id: str) -> dict[str, str]:
        future, new = self._claim(image_id)
        if new:
            self._fill(image_id, future)
        try:
            return future.result()
        except BaseException:
            with self._lock:  # a failed probe is tried again by the attempt's retry
                if self._probes.get(image_id) is future:
                    del self._probes[image_id]
            raise

    def _claim(self, image_id: str) -> tuple[Future[dict[str, str]], bool]:
        """The future of the image's probe, and whether it is new: then the caller fills it."""
        with self._lock:
            if image_id in self._probes:
                return self._probes[image_id], False
            future: Future[dict[str, str]] = Future()
            self._probes[image_id] = future
            return future, True

    def _fill(self, image_id: str, future: Future[dict[str, str]]) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="bisect-fingerprint-") as tmp:
                result = run_container(
                    self.client,
                    ContainerSpec(
                        image=image_id,
                        command=["sh", "-c", PROBE],
                        labels={KIND_LABEL: "fingerprint"},
                    ),
                    log_path=Path(tmp) / "probe.log",
                    timeout=120,
                    cancel=self._cancel,
                )
            future.set_result(parse_probe(result.output))
        except BaseException as exc:  # the attempt that waits for it raises it
            future.set_exception(exc)


def parse_probe(output: str) -> dict[str, str]:
    """pip freeze of the image (digest and count) and the CANN version files, if any."""
    freeze, _, cann = output.partition(_MARK)
    packages = [line for line in freeze.splitlines() if "==" in line or " @ " in line]
    facts = {
        "pip_freeze": hashlib.sha256("\n".join(packages).encode()).hexdigest()[:16],
        "pip_packages": str(len(packages)),
    }
    cann_lines = [line.strip() for line in cann.splitlines() if line.strip()]
    facts["cann"] = _version_text(cann_lines) if cann_lines else "absent"
    return facts


def host_facts() -> dict[str, str]:
    """Kernel, NPU driver version.info and npu-smi summary of the host, when present."""
    facts = {"kernel": platform.release()}
    try:
        lines = DRIVER_VERSION.read_text(errors="replace").splitlines()
        facts["driver"] = _version_text([line.strip() for line in lines if line.strip()])
    except OSError:
        facts["driver"] = "absent"
    facts["npu_smi"] = _npu_smi(facts["driver"])
    return facts


_SMI_SUMMARIES: dict[tuple[str, float, str], str] = {}
_SMI_LOCK = threading.Lock()


def _npu_smi(driver: str) -> str:
    """The version lines of `npu-smi info`, asked once per driver version and npu-smi binary:
    they follow the driver, and the tool queries every card, which takes a good part of a
    second on a busy host, every attempt. A failed call is asked again next time."""
    smi = next((path for name in NPU_SMI if (path := shutil.which(name))), None)
    if smi is None:
        return "absent"
    try:
        key = (smi, os.stat(smi).st_mtime, driver)
    except OSError:
        return "absent"
    with _SMI_LOCK:
        if key in _SMI_SUMMARIES:
            return _SMI_SUMMARIES[key]
        try:
            out = subprocess.run(
                [smi, "info"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return "failed"
        summary = [line.strip() for line in out.splitlines() if "Version" in line]
        _SMI_SUMMARIES[key] = " ".join(summary)[:200] or "no version line"
        return _SMI_SUMMARIES[key]


def _version_text(lines: list[str]) -> str:
    """The version lines when there are any, else a digest of the whole text."""
    versions = [line for line in lines if "version" in line.lower() and not line.startswith("#")]
    if versions:
        return "; ".join(versions)[:200]
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
