"""How the NPU reaches a container, decided against a faked host tree (no Docker needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.containers import Mount
from runner.devices import (
    CONTROL_DEVICES,
    DRIVER_PATHS,
    PRIVILEGED_DRIVER,
    Passthrough,
    is_simulator,
    passthrough,
)
from runner.errors import BadInput

needs_no_card_3 = pytest.mark.skipif(
    os.path.exists("/dev/davinci3"), reason="this host has a real NPU card 3"
)


def fake_host(root: Path, *paths: str) -> Path:
    """A host tree with the given driver files (directories for paths without a suffix)."""
    for path in paths:
        target = root / path.lstrip("/")
        if Path(path).suffix or path.endswith("npu-smi"):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("driver file\n")
        else:
            target.mkdir(parents=True, exist_ok=True)
    return root


def fake_nodes(root: Path, *cards: int) -> Path:
    """A host /dev with the cards' and the driver's control nodes, as links to /dev/null (a
    character device, as real nodes are)."""
    for node in (*(f"/dev/davinci{card}" for card in cards), *CONTROL_DEVICES):
        target = root / node.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to("/dev/null")
    return root


@pytest.mark.parametrize("platform", ["a2a3sim", "a5sim"])
@pytest.mark.parametrize("mode", ["explicit", "privileged", "ascend-runtime"])
def test_simulator_platforms_get_nothing_whatever_the_mode(platform, mode, tmp_path):
    host = fake_host(tmp_path, *DRIVER_PATHS)

    assert passthrough(mode, platform, ["3"], root=host) == Passthrough()
    # A map the simulator does not use is said so, not dropped without a word.
    mapped = passthrough(mode, platform, ["3"], ["/nonexistent:/dev/davinci0"], root=host)
    assert mapped == Passthrough(
        warnings=(f"--device-map is ignored on {platform}: a simulator gets no device",)
    )


def test_simulator_is_recognised_by_its_suffix():
    assert is_simulator("a2a3sim")
    assert is_simulator("a5sim")
    assert not is_simulator("a2a3")
    assert not is_simulator("a5")


def test_explicit_mapping_passes_only_the_mapped_device_and_existing_driver_files(tmp_path):
    host = fake_host(tmp_path, "/usr/local/Ascend/driver/lib64", "/usr/local/bin/npu-smi")

    result = passthrough("explicit", "a2a3", ["0"], ["/dev/null:/dev/davinci0"], root=host)

    assert result.devices == ("/dev/null:/dev/davinci0:rwm",)
    assert result.mounts == (
        Mount(str(host / "usr/local/bin/npu-smi"), "/usr/local/bin/npu-smi"),
        Mount(str(host / "usr/local/Ascend/driver/lib64"), "/usr/local/Ascend/driver/lib64"),
    )
    assert all(mount.read_only for mount in result.mounts)
    assert not result.privileged
    assert result.ipc_mode is None
    assert result.runtime is None
    assert result.warnings == ()


def test_explicit_mode_never_mounts_the_whole_ascend_tree(tmp_path):
    host = fake_host(tmp_path, *DRIVER_PATHS, "/usr/local/Ascend/ascend-toolkit")

    result = passthrough("explicit", "a5", ["0"], ["/dev/null:/dev/davinci0"], root=host)

    assert sorted(mount.container for mount in result.mounts) == sorted(DRIVER_PATHS)
    assert "/usr/local/Ascend" not in {mount.container for mount in result.mounts}


def test_a_device_map_without_driver_files_mounts_nothing_and_does_not_warn(tmp_path):
    # The map stands in for an NPU (tests, demos); on a real NPU host without driver files the
    # same call without a map warns that aclInit will fail.
    result = passthrough("explicit", "a2a3", ["0"], ["/dev/null:/dev/davinci0"], root=tmp_path)

    assert result.mounts == ()
    assert result.warnings == ()


def test_device_map_accepts_permissions(tmp_path):
    result = passthrough("explicit", "a2a3", ["1"], ["/dev/zero:/dev/davinci1:rw"], root=tmp_path)

    assert result.devices == ("/dev/zero:/dev/davinci1:rw",)


@needs_no_card_3
def test_a_missing_npu_device_is_reported_before_anything_is_built(tmp_path):
    with pytest.raises(BadInput) as error:
        passthrough("explicit", "a2a3", ["3"], root=tmp_path)

    assert str(error.value) == (
        "NPU device /dev/davinci3 is missing on this host; check --device, "
        "or use --device-map HOST:CONTAINER"
    )


def test_a_device_map_naming_a_missing_host_device_is_rejected(tmp_path):
    with pytest.raises(BadInput, match="/dev/davinci-nope named in --device-map is missing"):
        passthrough("explicit", "a2a3", ["0"], ["/dev/davinci-nope:/dev/davinci0"], root=tmp_path)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_device_map_naming_a_file_or_a_directory_is_rejected(tmp_path, kind):
    """Docker refuses it at every container start, which stopped the run as an infrastructure
    fault (exit 4) after every retry: it is a mistyped flag."""
    host = tmp_path / "not-a-device"
    host.touch() if kind == "file" else host.mkdir()
    with pytest.raises(BadInput) as error:
        passthrough("explicit", "a2a3", ["0"], [f"{host}:/dev/davinci0"], root=tmp_path)

    assert str(error.value) == (
        f"{host} named in --device-map is not a device node (a file or a directory); fix "
        "--device-map HOST:CONTAINER"
    )
    linked = tmp_path / "davinci"
    linked.symlink_to("/dev/null")  # a link to a device node is one
    assert passthrough("explicit", "a2a3", ["0"], [f"{linked}:/dev/davinci0"]).devices


@pytest.mark.parametrize(
    "entry", ["/dev/null", "dev/null:/dev/davinci0", "/dev/null:/dev/davinci0:rwx", "/a:/b:r:w"]
)
def test_malformed_device_maps_are_rejected(entry, tmp_path):
    with pytest.raises(BadInput, match="HOST:CONTAINER"):
        passthrough("explicit", "a2a3", ["0"], [entry], root=tmp_path)


@pytest.mark.parametrize("device", ["davinci0", "-1", "0,,1", "", "1.5"])
def test_devices_must_be_card_numbers(device, tmp_path):
    with pytest.raises(BadInput, match="is not an NPU card number"):
        passthrough("explicit", "a2a3", [device], ["/dev/null:/dev/davinci0"], root=tmp_path)


def test_an_npu_platform_needs_a_device(tmp_path):
    with pytest.raises(BadInput, match="pass --device N"):
        passthrough("explicit", "a2a3", [], ["/dev/null:/dev/davinci0"], root=tmp_path)


def test_an_unknown_mode_is_rejected(tmp_path):
    with pytest.raises(BadInput, match="explicit, privileged, ascend-runtime"):
        passthrough("host", "a2a3", ["0"], root=tmp_path)  # type: ignore[arg-type]


def test_privileged_mode_shares_dev_and_the_driver_with_a_warning(tmp_path):
    host = fake_host(tmp_path / "host", PRIVILEGED_DRIVER)

    result = passthrough("privileged", "a2a3", ["0"], root=host, nodes=fake_nodes(tmp_path, 0))

    assert result.privileged
    assert result.ipc_mode == "host"
    assert result.devices == ()
    assert result.mounts == (
        Mount("/dev", "/dev", read_only=False),
        Mount(str(host / "usr/local/Ascend/driver"), PRIVILEGED_DRIVER, read_only=True),
    )
    assert len(result.warnings) == 1
    assert "root-equivalent" in result.warnings[0]


def test_privileged_mode_without_a_driver_warns_and_ignores_a_device_map(tmp_path):
    nodes = fake_nodes(tmp_path / "nodes", 0)
    result = passthrough(
        "privileged", "a5", ["0"], ["/dev/null:/dev/davinci0"], root=tmp_path, nodes=nodes
    )

    assert result.mounts == (Mount("/dev", "/dev", read_only=False),)
    assert any(f"{PRIVILEGED_DRIVER} is missing" in warning for warning in result.warnings)
    assert any("--device-map is ignored" in warning for warning in result.warnings)


def test_privileged_mode_checks_the_cards_and_control_nodes_the_host_has(tmp_path):
    """All of /dev reaches the container, so nothing failed before the example: a card the
    host lacks was found after the first builds, when aclInit failed (exit 4, three tries)."""
    host = fake_host(tmp_path / "host", PRIVILEGED_DRIVER)
    nodes = fake_nodes(tmp_path / "nodes", 0, 1)

    with pytest.raises(BadInput, match=r"^NPU device /dev/davinci3 is missing on this host"):
        passthrough("privileged", "a2a3", ["0", "3"], root=host, nodes=nodes)
    (nodes / "dev/hisi_hdc").unlink()
    with pytest.raises(BadInput, match="NPU device /dev/hisi_hdc is missing"):
        passthrough("privileged", "a2a3", ["1"], root=host, nodes=nodes)
    (nodes / "dev/hisi_hdc").write_text("")
    with pytest.raises(BadInput, match="/dev/hisi_hdc is not a device node"):
        passthrough("privileged", "a2a3", ["1"], root=host, nodes=nodes)


def test_ascend_runtime_mode_names_the_visible_devices():
    result = passthrough("ascend-runtime", "a2a3", ["0,1", "3", "1"])

    assert result.runtime == "ascend"
    assert dict(result.environment) == {"ASCEND_VISIBLE_DEVICES": "0,1,3"}
    assert result.devices == ()
    assert result.mounts == ()
    assert not result.privileged


def test_explicit_mode_passes_every_card_and_the_control_devices_when_the_host_has_them():
    """Only meaningful on an NPU host; elsewhere the missing-device test covers this path."""
    cards = [card for card in ("0", "1") if os.path.exists(f"/dev/davinci{card}")]
    if not cards or not all(os.path.exists(node) for node in CONTROL_DEVICES):
        pytest.skip("no NPU on this host")

    result = passthrough("explicit", "a2a3", [",".join(cards)])

    nodes = [f"/dev/davinci{card}" for card in cards] + list(CONTROL_DEVICES)
    assert result.devices == tuple(f"{node}:{node}:rwm" for node in nodes)
