"""Vector sets on their way in, fast tier (issue 49): one set of rules for every way a set enters (a folder, a
control-vector GGUF, a learned set saved), each refusal a 400 naming the file as the client gave it and the key;
listing and removal from the registry, so one damaged set breaks nothing else; example files read only when they
are regular files of a bounded size."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from millm.errors import InvalidParameter
from millm.store.db import Store
from tests.support.malformed import (
    FOLDERS,
    GGUFS,
    LAYERS,
    MODEL_ONLY,
    D,
    empty_strings_gguf,
    gguf_file,
    huge_count_gguf,
    unit_rows,
    write_folder,
)


@pytest.mark.parametrize("case", sorted(set(FOLDERS) - MODEL_ONLY))
def test_a_malformed_folder_is_refused_naming_the_file_as_given_and_the_key(tmp_path: Path, case: str):
    from millm.sae import vector_sets

    write, file, key = FOLDERS[case]
    folder = write(tmp_path / "real-folder")
    (tmp_path / "given").symlink_to(folder)  # the client's path is a link: refusals name it, not its target
    with pytest.raises(InvalidParameter) as refused:
        vector_sets.load(tmp_path / "given", "given", "path")
    message = refused.value.message
    assert refused.value.param == "path" and refused.value.status == 400
    assert message.startswith(f"given/{file}"), message
    assert key in message and "real-folder" not in message, message


def test_a_folder_of_any_finite_non_zero_norm_is_stored_at_unit_norm(tmp_path: Path):
    import torch

    from millm.sae import vector_sets

    for name, values in (("big", unit_rows(2) * 1e6), ("huge", np.full((1, D), 1e30, dtype=np.float32)),
                         ("tiny", np.full((1, D), 1e-30, dtype=np.float32))):
        rows = len(values)
        names = ["rainy", "cloudy"][:rows]
        meta = {"format": "millm-vectors", "names": names, "layer": 3, "model": ""}
        folder = write_folder(tmp_path / name, meta, values.astype(np.float32))
        vs = vector_sets.load(folder)
        assert vs.vectors.dtype == torch.float32
        assert torch.allclose(vs.vectors.double().norm(dim=1), torch.ones(rows, dtype=torch.float64), atol=1e-6)
        expected = torch.from_numpy(values).double()
        assert torch.allclose(vs.vectors.double(), expected / expected.norm(dim=1, keepdim=True), atol=1e-6)


def test_a_set_that_breaks_the_rules_is_never_saved(tmp_path: Path):
    import torch

    from millm.sae import vector_sets
    from millm.sae.vector_sets import VectorSet

    good = torch.zeros(1, 8)
    good[0, 1] = 1.0
    for bad in (VectorSet(("rainy",), torch.full((1, 8), float("nan")), 3, "m"),
                VectorSet(("rainy",), torch.zeros(1, 8), 3, "m"),
                VectorSet(("rainy", "../../evil"), torch.cat([good, good]), 3, "m"),
                VectorSet(("rainy",), good, True, "m"),
                VectorSet(("rainy",), good, 10**30, "m")):
        with pytest.raises(InvalidParameter):
            vector_sets.save(tmp_path / "vectors" / "rainy", bad)
        assert not (tmp_path / "vectors").exists() or not any((tmp_path / "vectors").iterdir())
    vector_sets.save(tmp_path / "vectors" / "rainy", VectorSet(("rainy",), 5 * good, 3, "m"))
    assert float(vector_sets.load(tmp_path / "vectors" / "rainy").vectors.norm()) == pytest.approx(1.0)


@pytest.mark.parametrize("case", sorted(GGUFS))
def test_a_malformed_control_vector_is_refused_naming_the_file_as_given(tmp_path: Path, case: str):
    from millm.vectors import gguf

    tensors, match = GGUFS[case]
    real = gguf_file(tmp_path / "real.gguf", tensors)
    (tmp_path / "given.gguf").symlink_to(real)
    with pytest.raises(InvalidParameter, match=match) as refused:
        gguf.read(tmp_path / "given.gguf", LAYERS, D, "given.gguf")
    assert refused.value.message.startswith("given.gguf: ") and "real.gguf" not in refused.value.message


def test_a_finite_float32_direction_is_imported_whatever_its_float32_norm(tmp_path: Path):
    import torch

    from millm.vectors import gguf

    path = gguf_file(tmp_path / "loud.gguf", {"direction.4": np.full(D, 1e30, dtype=np.float32)})
    [vs] = gguf.imported_sets(gguf.read(path, LAYERS, D), "loud.gguf", "loud", "fake")
    assert float(vs.vectors.double().norm()) == pytest.approx(1.0)
    assert vs.source["norm"] == pytest.approx(1e30 * math.sqrt(D), rel=1e-6)
    assert bool(torch.isfinite(vs.vectors).all())


@pytest.mark.parametrize("maker", [empty_strings_gguf, huge_count_gguf])
def test_a_header_of_millions_of_values_is_refused_before_it_is_walked(tmp_path: Path, maker):
    from millm.vectors import gguf

    path = maker(tmp_path / "junk.gguf")
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="junk.gguf: not a GGUF file"):
        gguf.read(path, LAYERS, D)
    assert time.monotonic() - started < 2.0


def test_a_symlink_loop_or_a_fifo_is_refused_as_unreadable(tmp_path: Path):
    from millm.vectors import gguf

    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop)
    with pytest.raises(InvalidParameter, match="loop.gguf: cannot be read"):
        gguf.read(loop, LAYERS, D)
    os.mkfifo(tmp_path / "pipe.gguf")
    with pytest.raises(InvalidParameter, match="pipe.gguf: is a FIFO"):
        gguf.read(tmp_path / "pipe.gguf", LAYERS, D)


def service(tmp_path: Path):
    from millm.steering.service import SteeringService

    return SteeringService(Store(tmp_path / "millm.db"))


def stored(svc, home: Path, name: str):
    import torch

    from millm.sae.vector_sets import VectorSet
    from millm.vectors import catalog

    return catalog.store(svc, home, VectorSet((name,), torch.from_numpy(unit_rows()), 3, "toy", "diffmean", "mean",
                                              {"positive": 2, "negative": 2}))


def test_listing_comes_from_the_registry_and_flags_a_damaged_or_removed_set(tmp_path: Path):
    from millm.vectors import catalog

    svc = service(tmp_path)
    for name in ("vkept", "vdamaged", "vremoved"):
        stored(svc, tmp_path, name)
    (tmp_path / "vectors" / "vdamaged" / "vectors.json").write_text("[]")
    for file in (tmp_path / "vectors" / "vremoved").iterdir():
        file.unlink()
    (tmp_path / "vectors" / "vremoved").rmdir()
    rows = {row["id"]: row for row in catalog.vector_sets(svc)}
    assert set(rows) == {"vkept", "vdamaged", "vremoved"}
    assert rows["vkept"]["readable"] and rows["vkept"]["problem"] is None
    assert rows["vkept"]["method"] == "diffmean" and rows["vkept"]["examples"] == {"positive": 2, "negative": 2}
    for name in ("vdamaged", "vremoved"):
        assert not rows[name]["readable"] and "vectors.json" in rows[name]["problem"]
        assert (rows[name]["names"], rows[name]["layer"], rows[name]["model"]) == ([name], 3, "toy")
    with pytest.raises(InvalidParameter, match="vectors.json"):
        catalog.vector_set(svc, "vdamaged")


def test_a_damaged_or_removed_set_is_removed_without_being_loaded(tmp_path: Path):
    from millm.vectors import catalog

    svc = service(tmp_path)
    for name in ("vdamaged", "vremoved"):
        stored(svc, tmp_path, name)
    (tmp_path / "vectors" / "vdamaged" / "vectors.safetensors").write_bytes(b"junk")
    for file in (tmp_path / "vectors" / "vremoved").iterdir():
        file.unlink()
    (tmp_path / "vectors" / "vremoved").rmdir()
    for name in ("vdamaged", "vremoved"):
        catalog.remove(svc, tmp_path, name)
        assert svc.store.sae(name) is None and not (tmp_path / "vectors" / name).exists()
    assert catalog.vector_sets(svc) == []


def test_example_files_are_regular_files_of_bounded_size(tmp_path: Path):
    from millm.vectors.learn import EXAMPLES_MAX_BYTES, read_file

    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="/dev/zero: is a device") as refused:
        read_file(Path("/dev/zero"), "positive")
    assert refused.value.param == "positive"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InvalidParameter, match="is a FIFO"):
        read_file(tmp_path / "pipe", "negative")
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(EXAMPLES_MAX_BYTES + 1)
    with pytest.raises(InvalidParameter, match=f"big.txt: holds {EXAMPLES_MAX_BYTES + 1} bytes"):
        read_file(big, "positive")
    with pytest.raises(InvalidParameter, match="given.txt: no such file"):
        read_file(tmp_path / "missing.txt", "positive", "given.txt")
    assert time.monotonic() - started < 2.0
    (tmp_path / "ok.txt").write_text("It rains.\n" + json.dumps([{"role": "assistant", "content": "Storms."}]) + "\n")
    assert read_file(tmp_path / "ok.txt", "positive") == ["It rains.", "Storms."]


@pytest.mark.parametrize("spec", ["\u0663", "\uff15", "+3", "1_0", " ", "3-\u0665", "9" * 5000])
def test_a_layer_is_written_in_ascii_digits(spec: str):
    from millm.vectors.learn import parse_layers

    with pytest.raises(InvalidParameter) as refused:
        parse_layers([spec], LAYERS)
    assert refused.value.param == "layer"
    assert parse_layers(["3", "5-6", "8,9"], LAYERS) == [3, 5, 6, 8, 9]


def test_a_blank_concept_is_refused():
    from millm.vectors.learn import check_concepts

    with pytest.raises(InvalidParameter, match="'concept' must not hold a blank word") as refused:
        check_concepts(["rain", "  "], "concept")
    assert refused.value.param == "concept"
    assert check_concepts(["rain"]) == ["rain"]
