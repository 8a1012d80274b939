"""``millm vectors`` on the scripted engine (issue 49): a malformed control vector, a symlink loop, an example file
that is a device, a FIFO or too big, and a blank --concept are each one clear error line (no traceback) naming
the file as given, storing nothing; ``list`` flags a damaged or removed set and ``rm`` removes it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import app
from millm.config import get_settings
from tests.support.malformed import GGUFS, empty_strings_gguf, gguf_file, unit_rows

runner = CliRunner()


def run(*args: object, ok: bool = True) -> Result:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert "Traceback" not in result.output and "error:" in result.output, result.output
    return result


def nothing_stored() -> None:
    home = get_settings().home
    assert not (home / "vectors").exists() or not any((home / "vectors").iterdir())
    assert json.loads(run("vectors", "list", "--json").stdout) == []


@pytest.mark.parametrize("case", sorted(GGUFS))
def test_a_malformed_control_vector_is_one_error_line_naming_the_file_as_given(fake_cli, tmp_path: Path,
                                                                                case: str, monkeypatch):
    tensors, _ = GGUFS[case]
    real = gguf_file(tmp_path / "real.gguf", tensors)
    (tmp_path / "given.gguf").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    result = run("vectors", "import", "given.gguf", "rainy", ok=False)
    assert "given.gguf:" in result.output and "real.gguf" not in result.output, result.output
    nothing_stored()


def test_a_symlink_loop_and_a_header_of_millions_of_values_are_refused(fake_cli, tmp_path: Path):
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop)
    assert "loop.gguf: cannot be read" in run("vectors", "import", loop, "rainy", ok=False).output
    junk = empty_strings_gguf(tmp_path / "junk.gguf")
    started = time.monotonic()
    assert "junk.gguf: not a GGUF file" in run("vectors", "import", junk, "rainy", ok=False).output
    assert time.monotonic() - started < 5.0
    nothing_stored()


def test_example_files_must_be_regular_files_of_bounded_size(fake_cli, tmp_path: Path):
    from millm.vectors.learn import EXAMPLES_MAX_BYTES

    negative = tmp_path / "negative.txt"
    negative.write_text("The desk is oak.\nShe counted coins.\n")
    os.mkfifo(tmp_path / "pipe")
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(EXAMPLES_MAX_BYTES + 1)
    started = time.monotonic()
    for given, match in (("/dev/zero", "/dev/zero: is a device"), (tmp_path / "pipe", "pipe: is a FIFO"),
                         (big, "big.txt: holds")):
        result = run("vectors", "learn", "rainy", "--positive", given, "--negative", negative, ok=False)
        assert match in result.output, result.output
    assert time.monotonic() - started < 10.0
    nothing_stored()


def test_a_blank_concept_is_refused_as_the_api_refuses_it(fake_cli):
    for blank in ("", "   "):
        result = run("vectors", "learn", "rainy", "--concept", "rain", "--concept", blank, ok=False)
        assert "'concept' must not hold a blank word" in result.output, result.output
    nothing_stored()


def test_list_flags_a_damaged_or_removed_set_and_rm_removes_it(fake_cli):
    import torch

    from cli.common import steering_service
    from millm.sae.vector_sets import VectorSet
    from millm.vectors import catalog

    home = get_settings().home
    for name in ("vkept", "vdamaged", "vremoved"):
        catalog.store(steering_service(), home, VectorSet((name,), torch.from_numpy(unit_rows()), 3, "fake"))
    (home / "vectors" / "vdamaged" / "vectors.json").write_text('{"format": "millm-vectors", "layer": true}')
    for file in (home / "vectors" / "vremoved").iterdir():
        file.unlink()
    (home / "vectors" / "vremoved").rmdir()
    table = run("vectors", "list").output
    assert all(name in table for name in ("vkept", "vdamaged", "vremoved")) and "unreadable" in table, table
    rows = {row["id"]: row for row in json.loads(run("vectors", "list", "--json").stdout)}
    assert [rows[n]["readable"] for n in ("vkept", "vdamaged", "vremoved")] == [True, False, False]
    for name in ("vdamaged", "vremoved"):
        assert f"removed vector set {name}" in run("vectors", "rm", name).output
    assert [row["id"] for row in json.loads(run("vectors", "list", "--json").stdout)] == ["vkept"]
