"""Store files replaced in one step keep the mode a user gave them (``millm.atomic``)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from millm.atomic import replace_text


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_mode_not_owner_only(tmp_path, umask_022):
    path = tmp_path / "registry.json"
    replace_text(path, "[]")
    assert path.read_text() == "[]" and mode(path) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["registry.json"]  # no staging file left beside it


def test_a_replaced_file_keeps_its_mode(tmp_path, umask_022):
    path = tmp_path / "features.jsonl"
    path.write_text("old\n")
    path.chmod(0o664)  # a folder shared with a group
    replace_text(path, "new\n", durable=True)
    assert path.read_text() == "new\n" and mode(path) == 0o664


def test_a_failed_replace_leaves_the_old_file_and_no_staging_file(tmp_path, monkeypatch):
    path = tmp_path / "ledger.json"
    path.write_text("old")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        replace_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_saving_a_measured_strength_keeps_the_sae_files_mode(tmp_path, umask_022):
    from millm.research.saving import Measured, save_measured
    from millm.sae.measured import HeldOut

    features = tmp_path / "features.jsonl"
    features.write_text(json.dumps({"index": 3, "label": "rain"}) + "\n")
    features.chmod(0o644)
    held = HeldOut("neutral-v1", 40, calibration_rate=0.625, rate=7 / 16, low=0.23, high=0.67, answers=16)
    assert held.recommended
    save_measured(tmp_path, {3: Measured(held)})
    assert json.loads(features.read_text())["recommended_strength"] == 40 and mode(features) == 0o644
