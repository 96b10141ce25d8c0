"""How an NPU reaches an example container: pure decisions, checked against the host up front.

Three ways exist in the wild (see the domain notes). The default, ``explicit``, passes only the
device nodes and driver files an example needs, like vllm-ascend does; ``privileged`` is the
escape hatch some pypto users need when ``aclInit`` fails otherwise; ``ascend-runtime`` hands the
job to the Ascend Docker Runtime. Simulator platforms run on host threads and get nothing.

Every check happens here, before any image is built: a typo in ``--device`` should cost a second,
not a twenty-minute build followed by a container that cannot start.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from runner.containers import Mount
from runner.errors import BadInput

DeviceMode = Literal["explicit", "privileged", "ascend-runtime"]
DEVICE_MODES: tuple[str, ...] = get_args(DeviceMode)

CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
# Read-only driver files of the explicit mode. Never all of /usr/local/Ascend: it would shadow
# the CANN toolkit inside the image with whatever the host has installed.
DRIVER_PATHS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
PRIVILEGED_DRIVER = "/usr/local/Ascend/driver"
PRIVILEGED_WARNING = (
    "privileged mode gives every container all host devices and root-equivalent access to the "
    "host; use it only when --device-mode explicit makes aclInit fail"
)
_PERMISSIONS = frozenset("rwm")


@dataclass(frozen=True)
class Passthrough:
    """What a container needs for the NPU; `warnings` are for the user, not for Docker."""

    devices: tuple[str, ...] = ()  # "host:container:rwm"
    mounts: tuple[Mount, ...] = ()
    privileged: bool = False
    ipc_mode: str | None = None
    runtime: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def is_simulator(platform: str) -> bool:
    """a2a3sim and a5sim run on the CPU without CANN or an NPU."""
    return platform.endswith("sim")


def parse_devices(devices: Sequence[str]) -> tuple[int, ...]:
    """Card numbers from ``--device`` values; each value may be a comma list ("0,1")."""
    cards: list[int] = []
    for value in devices:
        for part in str(value).split(","):
            text = part.strip()
            if not text.isdigit():
                raise BadInput(
                    f"device {text!r} is not an NPU card number; pass --device 0, or --device 0,1 "
                    "for a distributed run"
                )
            card = int(text)
            if card not in cards:
                cards.append(card)
    return tuple(cards)


def parse_device_map(entries: Sequence[str]) -> tuple[str, ...]:
    """``HOST:CONTAINER[:PERMS]`` entries as Docker device strings (permissions default rwm)."""
    mapped: list[str] = []
    for entry in entries:
        parts = entry.split(":")
        if len(parts) == 2:
            parts.append("rwm")
        if (
            len(parts) != 3
            or not all(part.startswith("/") for part in parts[:2])
            or not parts[2]
            or not set(parts[2]) <= _PERMISSIONS
        ):
            raise BadInput(
                f"--device-map {entry!r} is not HOST:CONTAINER[:PERMS] with absolute paths; "
                "for example --device-map /dev/davinci4:/dev/davinci0"
            )
        mapped.append(":".join(parts))
    return tuple(mapped)


def passthrough(
    mode: DeviceMode,
    platform: str,
    devices: Sequence[str],
    device_map: Sequence[str] = (),
    *,
    root: Path = Path("/"),
    nodes: Path = Path("/"),
) -> Passthrough:
    """Decide the passthrough and check that the host has what it names.

    `root` prefixes the driver files (tests fake a host tree with it), `nodes` the cards' device
    nodes in the check (tests fake them as links to /dev/null); containers get the real paths,
    which Docker opens. A `--device-map` node is checked at its own path.
    """
    if mode not in DEVICE_MODES:
        raise BadInput(f"device mode {mode!r} is unknown; use one of {', '.join(DEVICE_MODES)}")
    cards = parse_devices(devices)
    mapped = parse_device_map(device_map)
    if is_simulator(platform):
        if mapped:
            return Passthrough(
                warnings=(f"--device-map is ignored on {platform}: a simulator gets no device",)
            )
        return Passthrough()
    if not cards:
        raise BadInput(
            f"platform {platform} runs on an NPU but no device was given; pass --device N"
        )
    ignored = (f"--device-map is ignored in {mode} mode",) if mapped else ()
    if mode == "ascend-runtime":
        return Passthrough(
            runtime="ascend",
            environment={"ASCEND_VISIBLE_DEVICES": ",".join(str(card) for card in cards)},
            warnings=ignored,
        )
    if mode == "privileged":
        # All of /dev reaches the container, but a card the host lacks fails the example's
        # aclInit: found only after the first builds, as an infrastructure stop.
        _card_nodes(cards, nodes)
        return _privileged(root, ignored)
    return _explicit(cards, mapped, root, nodes)


def _card_nodes(cards: tuple[int, ...], nodes: Path) -> tuple[str, ...]:
    """The cards' device nodes and the driver's control nodes, each checked on the host."""
    wanted = (*(f"/dev/davinci{card}" for card in cards), *CONTROL_DEVICES)
    for node in wanted:
        found = str(_on_host(nodes, node))
        if not os.path.exists(found):
            raise BadInput(
                f"NPU device {node} is missing on this host; check --device, "
                "or use --device-map HOST:CONTAINER"
            )
        if not _is_device(found):
            raise BadInput(
                f"{node} is not a device node on this host (a file or a directory); check "
                "the NPU driver's install, or use --device-map HOST:CONTAINER"
            )
    return wanted


def _explicit(
    cards: tuple[int, ...], mapped: tuple[str, ...], root: Path, nodes: Path
) -> Passthrough:
    if mapped:
        devices = mapped
        for device in mapped:
            host = device.split(":")[0]
            if not os.path.exists(host):
                raise BadInput(
                    f"device {host} named in --device-map is missing on this host; "
                    "fix --device-map HOST:CONTAINER"
                )
            if not _is_device(host):  # Docker refuses it at every container start (exit 4)
                raise BadInput(
                    f"{host} named in --device-map is not a device node (a file or a "
                    "directory); fix --device-map HOST:CONTAINER"
                )
    else:
        devices = tuple(f"{node}:{node}:rwm" for node in _card_nodes(cards, nodes))
    mounts = tuple(
        Mount(host=str(_on_host(root, path)), container=path)
        for path in DRIVER_PATHS
        if _on_host(root, path).exists()
    )
    warnings: tuple[str, ...] = ()
    if not mounts and not mapped:  # a device map stands in for an NPU: no driver is expected
        warnings = (
            f"none of the NPU driver files ({', '.join(DRIVER_PATHS)}) exist on this host; "
            "aclInit will likely fail inside the container",
        )
    return Passthrough(devices=devices, mounts=mounts, warnings=warnings)


def _privileged(root: Path, ignored: tuple[str, ...]) -> Passthrough:
    mounts = [Mount(host="/dev", container="/dev", read_only=False)]
    warnings = [PRIVILEGED_WARNING, *ignored]
    driver = _on_host(root, PRIVILEGED_DRIVER)
    if driver.exists():
        mounts.append(Mount(host=str(driver), container=PRIVILEGED_DRIVER))
    else:
        warnings.append(
            f"{PRIVILEGED_DRIVER} is missing on this host; aclInit will likely fail inside the "
            "container"
        )
    return Passthrough(
        mounts=tuple(mounts),
        privileged=True,
        ipc_mode="host",
        warnings=tuple(warnings),
    )


def _is_device(path: str) -> bool:
    """A character or block device node (through symlinks), which Docker can pass through."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def _on_host(root: Path, path: str) -> Path:
    return root / path.lstrip("/")
