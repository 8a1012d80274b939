"""llama.cpp control-vector files (``millm.vectors.gguf``, ``millm vectors export/import``): the format round
trips, each malformed file is refused naming the file and what is wrong, an import stores every set or none, a
profile's export sums its entries per layer, and the key interop check: a set exported at layer 10, read by
gguf-py's GGUFReader and applied through libllama's ``llama_set_adapter_cvec`` as ``--control-vector-scaled``
does, steers greedy text exactly as miLLM's GGUF steering of that set does."""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:

    from millm.engine.llama_engine import LlamaCppEngine

from typer.testing import CliRunner

from cli.main import app
from millm.engine.events import Delta
from millm.engine.params import GenerationRequest, SamplingParams, TextPrompt
from millm.errors import FieldNotHonoured, InvalidParameter
from millm.store.db import Store
from tests.support.malformed import gguf_file
from tests.support.saes import random_sae, write_saelens

if TYPE_CHECKING:
    import torch

    from millm.sae.vector_sets import VectorSet


D, LAYERS = 8, 8
runner = CliRunner()


def unit(d: int = D, seed: int = 0) -> torch.Tensor:
    import torch

    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


raw_file = gguf_file  # a GGUF written by gguf-py directly, as repeng's export_gguf writes one


def one_set(name: str, layer: int, seed: int = 0, d: int = D) -> VectorSet:
    from millm.sae.vector_sets import VectorSet

    return VectorSet((name,), unit(d, seed)[None, :], layer, "toy-model")


def test_a_file_round_trips_in_llamas_format(tmp_path: Path):
    import gguf as gguf_py
    import torch

    from millm.vectors import gguf

    directions = {3: unit(seed=1), 5: 2.5 * unit(seed=2)}
    path = tmp_path / "v.gguf"
    gguf.write(path, directions, "toy-model")
    reader = gguf_py.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "controlvector"
    assert reader.fields["controlvector.model_hint"].contents() == "toy-model"
    assert reader.fields["controlvector.layer_count"].contents() == 2
    assert [(t.name, t.tensor_type.name, [int(d) for d in t.shape]) for t in reader.tensors] == [
        ("direction.3", "F32", [D]), ("direction.5", "F32", [D])]
    back = gguf.read(path, LAYERS, D)
    assert back.model_hint == "toy-model" and sorted(back.directions) == [3, 5]
    assert all(torch.equal(back.directions[k], directions[k]) for k in directions)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.gguf"]  # no staging file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any file the user writes


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch):
    import gguf as gguf_py
    import torch

    from millm.vectors import gguf

    path = tmp_path / "v.gguf"
    gguf.write(path, {3: unit()}, "old")
    before = path.read_bytes()

    def full_disk(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_py.GGUFWriter, "write_tensors_to_file", full_disk)
    with pytest.raises(InvalidParameter, match="v.gguf: cannot be written .*No space left"):
        gguf.write(path, {4: unit(seed=3)}, "new")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["v.gguf"]
    for bad, match in (({}, "no layer has a direction"), ({0: unit()}, "start at layer 1"),
                       ({2: unit(), 3: unit(d=4)}, "one width"), ({2: torch.full((D,), float("nan"))}, "not finite")):
        with pytest.raises(InvalidParameter, match=match):
            gguf.write(path, bad, "new")
    assert path.read_bytes() == before


F32 = np.ones(D, dtype=np.float32)
MALFORMED = {
    "not-gguf": (None, "not a GGUF file"),
    "llama-arch": ({"direction.1": F32}, "general.architecture is 'llama', not 'controlvector'"),
    "no-directions": ({"other.1": F32}, "no direction.N tensors"),
    "layer-0": ({"direction.0": F32, "direction.1": F32}, "direction.0 steers layer 0"),
    "past-model": ({"direction.8": F32}, r"direction.8 is past the model's last layer \(7\)"),
    "not-a-layer": ({"direction.x": F32}, "'direction.x' does not name a layer"),
    "narrow": ({"direction.2": np.ones(6, dtype=np.float32)}, "direction.2 holds 6 values; the model's d_model is 8"),
    "half": ({"direction.2": np.ones(D, dtype=np.float16)}, "direction.2 is not a float32 vector"),
    "matrix": ({"direction.2": np.ones((2, D), dtype=np.float32)}, "direction.2 is not a float32 vector"),
    "nan": ({"direction.2": np.array([np.nan] + [1.0] * (D - 1), dtype=np.float32)}, "not finite"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_refused_naming_it_and_what_is_wrong(tmp_path: Path, case: str):
    from millm.vectors import gguf

    tensors, match = MALFORMED[case]
    path = tmp_path / f"{case}.gguf"
    if tensors is None:
        path.write_text("a text file, not a GGUF\n")
    else:
        raw_file(path, tensors, arch="llama" if case == "llama-arch" else "controlvector")
    with pytest.raises(InvalidParameter, match=match) as exc:
        gguf.read(path, LAYERS, D)
    assert str(path) in exc.value.message and exc.value.param == "file"
    with pytest.raises(InvalidParameter, match="no such file"):
        gguf.read(tmp_path / "missing.gguf", LAYERS, D)


def test_a_file_of_several_layers_imports_one_set_per_layer_or_the_layer_picked(tmp_path: Path):
    import torch

    from millm.vectors import gguf

    path = raw_file(tmp_path / "repeng.gguf", {"direction.3": 4 * unit(seed=1).numpy(),
                                               "direction.5": 0.5 * unit(seed=2).numpy()})
    cv = gguf.read(path, LAYERS, D)
    sets = gguf.imported_sets(cv, path, "calm", "toy-model")
    assert [(vs.names, vs.layer, vs.method, vs.model) for vs in sets] == [
        (("calm-L3",), 3, "imported", "toy-model"), (("calm-L5",), 5, "imported", "toy-model")]
    assert [round(vs.source["norm"], 4) for vs in sets] == [4.0, 0.5]
    assert sets[0].source["file"] == str(path) and sets[0].source["model_hint"] == "llama"
    assert all(torch.allclose(vs.vectors.norm(dim=-1), torch.ones(1)) for vs in sets)
    assert torch.allclose(sets[0].vectors[0] * sets[0].source["norm"], cv.directions[3])  # the file's own scale
    [picked] = gguf.imported_sets(cv, path, "calm", "toy-model", layer=5)
    assert picked.names == ("calm",) and picked.layer == 5
    with pytest.raises(InvalidParameter, match="no direction.4; it holds layers 3, 5"):
        gguf.imported_sets(cv, path, "calm", "toy-model", layer=4)
    zero = raw_file(tmp_path / "zero.gguf", {"direction.2": np.zeros(D, dtype=np.float32)})
    with pytest.raises(InvalidParameter, match="direction.2 has no direction"):
        gguf.imported_sets(gguf.read(zero, LAYERS, D), zero, "z", "toy-model")


def test_an_import_that_fails_midway_stores_nothing(tmp_path: Path, monkeypatch):
    from millm.steering.service import SteeringService
    from millm.vectors import catalog

    service = SteeringService(Store(tmp_path / "millm.db"))
    sets = [one_set(f"part-L{i}", i, seed=i) for i in range(1, 6)]
    real_register, calls = service.register_sae, []

    def third_fails(folder, name, sae_id):  # the third registration of the one transaction fails
        calls.append(name)
        if len(calls) == 3:
            raise OSError("disk full")
        return real_register(folder, name=name, sae_id=sae_id)

    monkeypatch.setattr(service, "register_sae", third_fails)
    with pytest.raises(OSError, match="disk full"):
        catalog.store_all(service, tmp_path, sets)
    monkeypatch.undo()
    assert calls == ["part-L1", "part-L2", "part-L3"]
    assert catalog.vector_sets(service) == [] and not any((tmp_path / "vectors").iterdir())

    catalog.store(service, tmp_path, one_set("part-L4", 4))
    with pytest.raises(InvalidParameter, match="'part-L4' is already the id"):
        catalog.store_all(service, tmp_path, sets)  # a taken name: refused before any is stored
    assert [s["id"] for s in catalog.vector_sets(service)] == ["part-L4"]
    stored = catalog.store_all(service, tmp_path, [vs for vs in sets if vs.names[0] != "part-L4"])
    assert len(stored) == 4 and len(catalog.vector_sets(service)) == 5


def test_a_profile_exports_its_entries_summed_per_layer(tmp_path: Path):
    import torch

    from millm.sae.vector_sets import VectorSet
    from millm.steering.profiles import parse_profile
    from millm.steering.service import SteeringService
    from millm.vectors import catalog, gguf

    service = SteeringService(Store(tmp_path / "millm.db"))
    sae = random_sae(D, 4, seed=7)
    service.register_sae(write_saelens(tmp_path / "toy-sae", sae, layer=3), sae_id="toy-sae")
    for vs in (one_set("toy-up", 3, seed=1), one_set("toy-down", 5, seed=2)):
        catalog.store(service, tmp_path, vs)
    doc = parse_profile({"name": "mix", "model": "toy-model", "entries": [
        {"sae": "toy-up", "feature": 0, "strength": 2.0}, {"sae": "toy-sae", "feature": 1, "strength": -3.0},
        {"sae": "toy-down", "feature": 0, "strength": 500.0}]})  # clamped to 200, as steering applies it
    directions = gguf.profile_directions(service, doc, "toy-model")
    assert sorted(directions) == [3, 5]
    assert torch.allclose(directions[3], 2 * unit(seed=1) - 3 * sae.W_dec[1], atol=1e-6)
    assert torch.allclose(directions[5], 200 * unit(seed=2), atol=1e-5)

    service.store.set_state("steering:toy-model", {"attachments": {"toy-sae": 6}})  # attached elsewhere: placed there
    by_layer = parse_profile({"name": "at6", "entries": [{"sae": 6, "feature": 2, "strength": 1.5}]})
    assert torch.allclose(gguf.profile_directions(service, by_layer, "toy-model")[6], 1.5 * sae.W_dec[2])
    assert sorted(gguf.profile_directions(service, doc, "toy-model")) == [3, 5, 6]
    for entries, match in (([{"sae": 2, "feature": 0, "strength": 1.0}], "no SAE is attached to layer 2"),
                           ([{"sae": "toy-up", "feature": 3, "strength": 1.0}], "feature 3 is outside"),
                           ([{"sae": "nope", "feature": 0, "strength": 1.0}], "No SAE has id 'nope'")):
        with pytest.raises(InvalidParameter, match=rf"Profile 'bad' entries\[0\]: {match}"):
            gguf.profile_directions(service, parse_profile({"name": "bad", "entries": entries}), "toy-model")
    scoped = parse_profile({"name": "scoped", "entries": doc.model_dump()["entries"], "steering_scope": "generated"})
    with pytest.raises(InvalidParameter, match="steers generated positions only; a control-vector file applies to"):
        gguf.profile_directions(service, scoped, "toy-model")
    with pytest.raises(InvalidParameter, match="one direction per layer; this set holds 2"):
        gguf.set_directions(VectorSet(("a", "b"), torch.eye(2, D), 3, "toy-model"))


# the real model: the CLI, the unembedding, and llama.cpp's own loader


def run(*args: object, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def test_unembed_is_the_output_embedding_without_the_final_norm(engine):
    import torch

    weight = engine.model.get_output_embeddings().weight.float()
    v = unit(weight.shape[1], seed=4)
    assert torch.allclose(engine.unembed(v), weight @ v, atol=1e-4)
    with pytest.raises(InvalidParameter, match="width 576"):
        engine.unembed(torch.ones(4))


def test_cli_import_show_export_and_a_profile(engine, tmp_path: Path):
    import torch

    from millm.local import steering_service
    from millm.vectors import gguf

    dog = engine.tokenizer.encode(" dog", add_special_tokens=False)[0]
    row = engine.model.get_output_embeddings().weight[dog].detach().float()
    path = raw_file(tmp_path / "two.gguf", {"direction.5": unit(576, seed=5).numpy(),
                                            "direction.10": (3 * row).numpy()})
    service = steering_service()
    try:
        imported = run("vectors", "import", path, "cvx").output
        assert "vector set cvx-L5: direction.5" in imported and "vector set cvx-L10: direction.10" in imported
        shown = run("vectors", "show", "cvx-L10").output
        promoted = shown.split("promotes: ")[1].split(", ")
        assert "imported at layer 10" in shown and f'"file": "{path}"' in shown
        assert any(token.startswith("' dog' ") for token in promoted[:3])  # the token whose row it is
        run("vectors", "import", path, "cvy", "--layer", "10")
        again = run("vectors", "import", path, "cvx", ok=False)
        assert again.exit_code == 1 and "'cvx-L5' is already the id" in again.output
        bad = run("vectors", "import", tmp_path / "missing.gguf", "cvz", ok=False)
        assert bad.exit_code == 1 and "missing.gguf: no such file" in bad.output
        names = {s["id"] for s in json.loads(run("vectors", "list", "--json").output)}
        assert {"cvx-L5", "cvx-L10", "cvy"} <= names and not any(name.startswith("cvz") for name in names)

        out = tmp_path / "cvy.gguf"
        assert "--control-vector-scaled" in run("vectors", "export", "cvy", out).output
        back = gguf.read(out, 30, 576)
        assert list(back.directions) == [10] and torch.allclose(back.directions[10], row / row.norm(), atol=1e-6)

        service.save_profile({"name": "cvmix", "entries": [{"sae": "cvx-L5", "feature": 0, "strength": 2.0},
                                                           {"sae": "cvy", "feature": 0, "strength": 3.0},
                                                           {"sae": "cvx-L10", "feature": 0, "strength": 1.0}]},
                             overwrite=False)
        mixed = tmp_path / "mix.gguf"
        assert "direction.5, direction.10" in run("vectors", "export", "--profile", "cvmix", mixed).output
        sums = gguf.read(mixed, 30, 576).directions
        assert torch.allclose(sums[5], 2 * unit(576, seed=5), atol=1e-5)
        assert torch.allclose(sums[10], 4 * row / row.norm(), atol=1e-5)
        for args, match in ((["cvy"], "Give NAME FILE"), (["--profile", "cvmix", "cvy", mixed], "file alone"),
                            (["nothere", mixed], "No vector set is named 'nothere'")):
            refused = run("vectors", "export", *args, ok=False)
            assert refused.exit_code == 1 and match in refused.output
    finally:
        if service.store.profile("cvmix") is not None:
            service.delete_profile("cvmix")
        for name in ("cvx-L5", "cvx-L10", "cvy"):
            if service.store.sae(name) is not None:
                run("vectors", "rm", name)


# llama.cpp's own loader against miLLM's GGUF steering

PROMPT, STRENGTH, TOKENS = "My favourite thing to do on a weekend is", 40.0, 16


@pytest.fixture(scope="module")
def steered(gguf_engine, settings) -> Iterator[LlamaCppEngine]:
    """The bundled GGUF file under MILLM_GGUF_STEERING (miLLM's control-vector steering)."""
    from millm.engine.llama_engine import LlamaCppEngine

    settings.gguf_steering = True
    try:
        eng = LlamaCppEngine.load(gguf_engine.entry, settings)
    finally:
        settings.gguf_steering = False
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def plain_llama(steered):
    """A second llama-cpp-python Llama of the same file, loaded as miLLM loads it, steered only by libllama."""
    from llama_cpp import Llama

    llm = Llama(str(steered.entry.path), n_ctx=0, n_threads=os.cpu_count(), verbose=False)
    yield llm
    llm.close()


def millm_greedy(eng: LlamaCppEngine) -> str:
    plan = eng.prepare(GenerationRequest([TextPrompt(PROMPT)], SamplingParams(temperature=0.0, max_tokens=TOKENS)))
    return "".join(e.text for e in eng.run(plan) if isinstance(e, Delta))


def llama_cpp_greedy(llm, file: Path | None, scale: float, stop_ids: frozenset[int]) -> str:
    """Greedy text with ``file`` loaded as llama.cpp's common loader loads ``--control-vector-scaled FILE S``:
    each ``direction.N`` times S at ``data[(N - 1) * n_embd]``, applied to layers 1..n_layer."""
    import llama_cpp
    from gguf import GGUFReader

    n_embd = int(llm.n_embd())
    if file is None:
        rc = llama_cpp.llama_set_adapter_cvec(llm.ctx, None, 0, n_embd, -1, -1)
    else:
        reader = GGUFReader(file)
        assert str(reader.fields["general.architecture"].contents()) == "controlvector"
        found = {int(t.name.split(".")[1]): np.array(t.data, dtype=np.float32) for t in reader.tensors}
        data = np.zeros(n_embd * max(found), dtype=np.float32)
        for layer, values in found.items():
            data[(layer - 1) * n_embd:layer * n_embd] = values * scale
        rc = llama_cpp.llama_set_adapter_cvec(llm.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size,
                                              n_embd, 1, int(llama_cpp.llama_model_n_layer(llm.model)))
    assert rc == 0
    llm.reset()
    ids: list[int] = []
    for token in llm.generate(llm.tokenize(PROMPT.encode(), add_bos=True, special=True), temp=0.0):
        if token in stop_ids or len(ids) == TOKENS:
            break
        ids.append(token)
    return llm.detokenize(ids).decode("utf-8", errors="replace")


def test_an_exported_set_steers_llama_cpp_as_millm_steers_it(steered, plain_llama, tmp_path: Path):
    from millm.vectors import gguf

    vs = one_set("interop", 10, seed=10, d=576)
    file = tmp_path / "interop.gguf"
    gguf.write(file, gguf.set_directions(vs), steered.model_id)
    target = steered.steering_target()
    assert target is not None
    steering = target.steering
    unsteered = millm_greedy(steered)
    assert llama_cpp_greedy(plain_llama, None, 0.0, steered.stop_ids) == unsteered  # the two harnesses agree
    steering.attach("interop", vs.as_sae(), vs.layer)
    try:
        steering.set_values("interop", {0: STRENGTH}, merge=False)
        ours = millm_greedy(steered)
    finally:
        steering.detach("interop")
    theirs = llama_cpp_greedy(plain_llama, file, STRENGTH, steered.stop_ids)
    print(f"unsteered {unsteered!r}\nmiLLM     {ours!r}\nllama.cpp {theirs!r}")
    assert theirs == ours and ours != unsteered


def test_the_llama_cpp_engine_refuses_to_unembed(steered):
    import torch

    with pytest.raises(FieldNotHonoured, match="transformers model"):
        steered.unembed(torch.ones(576))
