"""Steering vectors, fast tier: the directions on hand-built activations, the folder format, reading a set as an
SAE of its vectors, example files, names that collide, and a vector set beside an SAE on one layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millm.errors import InvalidParameter
from millm.store.db import Store
from tests.support.saes import random_sae, write_saelens

if TYPE_CHECKING:
    import torch

    from millm.sae.vector_sets import VectorSet


D = 8


def toy(shift: float = 3.0, n: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Negatives around 0, positives around ``shift`` along a known unit axis (and noise on every axis)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    axis = torch.zeros(D)
    axis[2] = 1.0
    negative = torch.randn(n, D, generator=g) * 0.3
    positive = torch.randn(n, D, generator=g) * 0.3 + shift * axis
    return positive, negative, axis


@pytest.mark.parametrize("name", ["diffmean", "pca"])
def test_the_direction_is_the_concepts_axis_unit_norm_and_positive(name):
    import torch

    from millm.vectors.learn import DIRECTIONS

    positive, negative, axis = toy()
    direction = DIRECTIONS[name](positive, negative)
    assert torch.isclose(direction.norm(), torch.tensor(1.0))
    assert float(direction @ axis) > 0.95  # found, and signed so positives project higher
    assert float((positive @ direction).mean()) > float((negative @ direction).mean())


def test_diffmean_is_the_normalised_difference_of_means_and_refuses_no_difference():
    import torch

    from millm.vectors.learn import diffmean, pca

    positive = torch.tensor([[2.0, 0.0], [4.0, 0.0]])
    negative = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    assert torch.allclose(diffmean(positive, negative), torch.tensor([3.0, -2.0]) / 13 ** 0.5)
    with pytest.raises(InvalidParameter, match="read alike"):
        diffmean(positive, positive)
    with pytest.raises(InvalidParameter, match="at least 2"):
        pca(positive[:1], negative[:1])


def vector_set(name: str = "rainy", layer: int = 3, d: int = D) -> VectorSet:
    import torch

    from millm.sae.vector_sets import VectorSet

    v = torch.zeros(1, d)
    v[0, 1] = 1.0
    return VectorSet((name,), v, layer, "toy-model", "diffmean", "mean", {"positive": 4, "negative": 4}, "abc",
                     {"concepts": ["rain"]})


def test_a_set_round_trips_and_reads_as_a_linear_sae_of_its_vectors(tmp_path: Path):
    import torch

    from millm.sae import vector_sets
    from millm.sae.formats import load_sae

    folder = tmp_path / "rainy"
    vector_sets.save(folder, vector_set())
    assert sorted(p.name for p in folder.iterdir()) == ["labels.json", "vectors.json", "vectors.safetensors"]
    assert json.loads((folder / "labels.json").read_text()) == {"0": "rainy"}
    back = vector_sets.load(folder)
    assert back.names == ("rainy",) and back.layer == 3 and torch.equal(back.vectors, vector_set().vectors)
    loaded = load_sae(folder)
    assert (loaded.format, loaded.layer_hint, loaded.model_hint) == ("vectors", 3, "toy-model")
    x = torch.tensor([[0.0, -2.5, 0, 0, 0, 0, 0, 1.0]])
    assert loaded.sae.encode(x).tolist() == [[-2.5]]  # the signed projection: a reading, not a ReLU
    assert torch.equal(loaded.sae.decode(torch.tensor([[4.0]])), 4.0 * vector_set().vectors)  # strength x unit
    (folder / "vectors.json").write_text('{"format": "other"}')
    with pytest.raises(InvalidParameter, match="vectors.json"):
        vector_sets.load(folder)


def test_example_files_take_lines_or_chat_messages_and_name_a_bad_line(tmp_path: Path):
    from millm.vectors.learn import read_file

    plain = tmp_path / "plain.txt"
    plain.write_text("It rains.\n\nClouds again.\n")
    assert read_file(plain, "positive") == ["It rains.", "Clouds again."]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "Rain!"}]}) + "\n"
                     + json.dumps([{"role": "assistant", "content": "Storms."}]) + "\n")
    assert read_file(chats, "positive") == ["Rain!", "Storms."]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    with pytest.raises(InvalidParameter, match="bad.jsonl, line 1") as exc:
        read_file(bad, "negative")
    assert exc.value.param == "negative"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(InvalidParameter, match="no example"):
        read_file(empty, "positive")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(InvalidParameter, match="UTF-8"):
        read_file(tmp_path / "latin1.txt", "positive")


def test_a_name_taken_by_an_sae_or_a_feature_label_is_refused_before_anything_is_written(tmp_path: Path):
    from millm.steering.service import SteeringService
    from millm.vectors import catalog

    service = SteeringService(Store(tmp_path / "millm.db"))
    sae_folder = write_saelens(tmp_path / "toy-sae", random_sae(D, 4), layer=3)
    (sae_folder / "labels.json").write_text(json.dumps({"2": "Rainy"}))
    service.register_sae(sae_folder, sae_id="toy-sae")
    for name, match in (("rainy", "label of feature 2 of SAE toy-sae"), ("toy-sae", "already the id"),
                        ("bad/name", "'name' must be")):
        with pytest.raises(InvalidParameter, match=match):
            catalog.store(service, tmp_path, vector_set(name))
        assert not (tmp_path / "vectors" / name).exists()
    record = catalog.store(service, tmp_path, vector_set("drizzle"))
    assert record["format"] == "vectors" and service.store.label_map("drizzle") == {0: "drizzle"}
    assert [s["id"] for s in catalog.vector_sets(service)] == ["drizzle"]
    with pytest.raises(InvalidParameter, match="already the id"):
        catalog.store(service, tmp_path, vector_set("drizzle"))
    catalog.remove(service, tmp_path, "drizzle")
    assert service.store.sae("drizzle") is None and not (tmp_path / "vectors" / "drizzle").exists()


def test_a_vector_set_shares_a_layer_with_an_sae_and_their_deltas_add():
    import torch

    from millm.steering.core import SteeringCore
    from millm.steering.cvec import ControlVectorSteering

    core = SteeringCore(n_layers=6, d_model=D, device=torch.device("cpu"), dtype=torch.float32)
    sae = random_sae(D, 4, seed=1)
    core.attach("sae", sae, 3)
    core.attach("vec", vector_set().as_sae(), 3)  # beside it
    with pytest.raises(InvalidParameter, match="already has SAE"):
        core.attach("other", random_sae(D, 4, seed=2), 3)  # but two SAEs still may not
    with pytest.raises(InvalidParameter, match="d_in 4"):
        core.attach("narrow", vector_set(d=4).as_sae(), 2)  # a set of another model's width

    cvec = ControlVectorSteering(n_layers=6, d_model=D)
    cvec.attach("sae", sae, 3)
    cvec.attach("vec", vector_set().as_sae(), 3)
    cvec.set_values("sae", {0: 10.0}, merge=False)
    cvec.set_values("vec", {0: 5.0}, merge=False)
    cvec.bind_row(0, None)
    vector = cvec.vector()
    assert vector is not None
    at = vector.data[(3 - 1) * D:3 * D]
    assert torch.allclose(torch.from_numpy(at), 10.0 * sae.W_dec[0] + 5.0 * vector_set().vectors[0], atol=1e-5)


@pytest.mark.parametrize(("specs", "layers"), [
    (["10"], [10]), ([10], [10]), (["8-10"], [8, 9, 10]), (["8,12", "10-11"], [8, 10, 11, 12]),
    (["9", "9-10", " 10 "], [9, 10]), (["0-0"], [0]), (["29"], [29]),
])
def test_layers_take_one_a_range_or_a_list_sorted_once_each(specs, layers):
    from millm.vectors.learn import parse_layers

    assert parse_layers(specs, 30) == layers


@pytest.mark.parametrize(("specs", "says"), [
    (["30"], "between 0 and 29"), (["-1"], "a range like 8-12"), (["12-10"], "runs backwards"),
    (["ten"], "a range like 8-12"), (["8,"], "a range like 8-12"), (["5-40"], "between 0 and 29"), ([], "no layer"),
])
def test_a_bad_layer_spec_is_refused_naming_layer(specs, says):
    from millm.vectors.learn import parse_layers

    with pytest.raises(InvalidParameter) as raised:
        parse_layers(specs, 30)
    assert raised.value.param == "layer" and says in raised.value.message


def test_one_layer_keeps_the_name_several_are_suffixed_as_imports_are():
    from millm.sae.vector_sets import set_name
    from millm.vectors.learn import default_layer

    assert set_name("rain", 10, [10]) == "rain"
    assert [set_name("rain", at, [8, 10]) for at in (8, 10)] == ["rain-L8", "rain-L10"]
    assert default_layer(30) == 14 and default_layer(24) == 11


def test_generated_negatives_are_the_same_requests_about_other_topics(monkeypatch):
    import millm.vectors.learn as learn
    from millm.research.measure import NEUTRAL_PROMPTS
    from millm.vectors.learn import CONCEPT_PROMPTS, generated, other_topics

    asked: list[str] = []

    def answers(engine, prompts, seed, tokens, finished, control=None):
        asked.extend(prompts)
        return [[f"answer {i} on {p.split()[-1]}" for i, p in enumerate(prompts)]]

    monkeypatch.setattr(learn, "sample_answers", answers)
    made = generated(None, ["music"], 4, 0)  # type: ignore[arg-type]  # the sampler is replaced
    assert asked[:4] == [p.format("music") for p in CONCEPT_PROMPTS[:4]]
    assert asked[4:] == [p.format(t) for p, t in zip(CONCEPT_PROMPTS[:4], other_topics(["music"]))]
    assert "music" not in other_topics(["music"]) and "the ocean" not in other_topics(["ocean life"])
    # the third answer ends on "paragraph." and never names music: it is no positive (by_mention)
    assert made.positive == ["answer 0 on music.", "answer 1 on music.", "answer 3 on music?"]
    assert len(made.negative) == 4
    asked.clear()
    generated(None, ["music"], 2, 0, negatives="neutral")  # type: ignore[arg-type]
    assert asked[2:] == list(NEUTRAL_PROMPTS[:2])
    with pytest.raises(InvalidParameter) as raised:
        generated(None, ["music"], 2, 0, negatives="others")  # type: ignore[arg-type]
    assert raised.value.param == "negatives"


def test_generated_examples_are_kept_by_whether_they_name_the_concept():
    """A positive that never names the concept does not show it; a negative that names it is no negative (the
    words as the sweep's concept rate counts them: singular or plural, whole words)."""
    from millm.vectors.learn import Examples, by_mention

    made = Examples(["Dogs bark.", "A puppy sleeps.", "my dog", "hotdogs"], ["Cats purr.", "a dog too", "Fish swim."])
    kept = by_mention(made, ["dog"])
    assert kept == Examples(["Dogs bark.", "my dog"], ["Cats purr.", "Fish swim."])
    assert by_mention(made, ["dog", "puppy"]).positive == ["Dogs bark.", "A puppy sleeps.", "my dog"]
    with pytest.raises(InvalidParameter, match="None of the 4 answers about cat names it") as raised:
        by_mention(made, ["cat"])
    assert raised.value.param == "concepts"
    with pytest.raises(InvalidParameter, match="Every negative answer names"):
        by_mention(Examples(["a dog"], ["dogs", "a dog"]), ["dog"])


def test_generated_reports_each_answer_as_it_ends():
    """The progress a learn shows (a bar in the CLI, the job's progress over HTTP): one report per answer."""
    from millm.vectors.learn import generated
    from tests.support.fakes import FakeEngine

    heard: list[int] = []
    # the fake answers its one script ("Hello from the fake engine. ...") to everything, so the negatives name
    # "engine" as the positives do: all six answers are written and reported, then the negatives are refused
    with pytest.raises(InvalidParameter, match="Every negative answer names"):
        generated(FakeEngine(steerable=True), ["engine"], 3, 0, tokens=64, finished=heard.append)  # type: ignore[arg-type]
    assert heard == [1, 2, 3, 4, 5, 6]
