"""The TopK trainer on hand-built data, label search and name resolution, and a tiny real training run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millm.errors import InvalidParameter

if TYPE_CHECKING:
    import torch

    from millm.sae.training.train import TopKTrainer


def planted(n: int = 6000, d: int = 32, atoms: int = 96, active: int = 3, seed: int = 0) -> torch.Tensor:
    """Activations that are sparse sums of unit atoms plus an offset (what an SAE should recover)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randn(atoms, d, generator=g)
    dictionary /= dictionary.norm(dim=-1, keepdim=True)
    codes = torch.zeros(n, atoms)
    codes.scatter_(1, torch.randint(0, atoms, (n, active), generator=g), torch.rand(n, active, generator=g) * 4 + 1)
    return codes @ dictionary + 2.0


def trainer_for(x: torch.Tensor, **kw) -> TopKTrainer:
    from millm.sae.training.train import TopKTrainer, TrainConfig

    config = TrainConfig(**{"d_in": x.shape[1], "d_sae": 128, "k": 6, "steps": 150, "batch_size": 256, **kw})
    return TopKTrainer(config, x.mean(0), x.shape[1] ** 0.5 / float(x.norm(dim=-1).mean()))


def test_loss_falls_and_decoder_rows_stay_unit_norm() -> None:
    import torch

    from millm.sae.training.train import ShuffledBatches, train

    x = planted()
    trainer = trainer_for(x)
    losses: list[float] = []
    train(trainer, ShuffledBatches(x, 256, seed=0), on_step=lambda s: losses.append(s.fvu))
    assert len(losses) == 150
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    assert torch.allclose(trainer.W_dec.norm(dim=-1), torch.ones(128), atol=1e-5)


def test_export_reads_raw_activations_like_the_trainer() -> None:
    """Folding the input scale out keeps the chosen latents and gives the reconstruction in raw units."""
    import torch

    from millm.sae.training.train import ShuffledBatches, train

    x = planted()
    trainer = trainer_for(x, steps=30)
    train(trainer, ShuffledBatches(x, 256, seed=0))
    sae = trainer.export()
    batch = x[:64]
    with torch.no_grad():
        scaled = batch * trainer.scale
        pre = (scaled - trainer.b_dec) @ trainer.W_enc + trainer.b_enc
        inner = torch.zeros_like(pre).scatter(-1, pre.topk(6, dim=-1).indices, pre.topk(6, dim=-1).values.relu())
        expected = (inner @ trainer.W_dec + trainer.b_dec) / trainer.scale
    acts = sae.encode(batch)
    assert torch.equal((acts > 0), (inner > 0))
    assert torch.allclose(sae.decode(acts), expected, atol=1e-4)
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(128), atol=1e-5)


def test_auxk_loss_is_zero_without_dead_latents_and_trains_only_dead_ones() -> None:
    import torch

    from millm.sae.training.train import auxk_error_fit

    g = torch.Generator().manual_seed(1)
    pre, error = torch.randn(16, 10, generator=g), torch.randn(16, 4, generator=g)
    W_dec = torch.randn(10, 4, generator=g).requires_grad_()
    assert float(auxk_error_fit(pre, torch.zeros(10, dtype=torch.bool), error, W_dec, aux_k=2)) == 0.0
    dead = torch.zeros(10, dtype=torch.bool)
    dead[[2, 7]] = True
    loss = auxk_error_fit(pre, dead, error, W_dec, aux_k=4)
    loss.backward()
    assert float(loss.detach()) > 0
    moved = W_dec.grad.abs().sum(-1) > 0
    assert moved[2] and moved[7] and not moved[~dead].any()


def test_dead_latents_are_counted_by_the_window() -> None:
    import torch

    x = planted()
    trainer = trainer_for(x, dead_tokens=512, steps=4)
    never = torch.ones(128, dtype=torch.bool)
    for i in range(4):
        trainer.step(x[i * 256:(i + 1) * 256])
    fired_any = trainer.tokens_since_fired < 4 * 256
    never &= ~fired_any
    assert torch.equal(trainer.dead, never)


def test_learning_rate_warms_up_and_decays_to_zero() -> None:
    from millm.sae.training.train import TrainConfig

    config = TrainConfig(d_in=4, d_sae=8, k=2, steps=100, lr=1e-3)
    rates = [config.lr_at(s) for s in range(100)]
    assert rates[0] == pytest.approx(1e-3 / 5)
    assert rates[10] == pytest.approx(1e-3) and rates[79] == pytest.approx(1e-3)
    assert rates[99] == pytest.approx(1e-3 / 20)
    assert all(a >= b for a, b in zip(rates[80:], rates[81:]))


def test_resume_from_checkpoint_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    import torch

    from millm.sae.training.train import ShuffledBatches, TopKTrainer, train

    x = planted()
    straight = trainer_for(x, steps=20)
    train(straight, ShuffledBatches(x, 256, seed=3))
    first = trainer_for(x, steps=20)
    batches = ShuffledBatches(x, 256, seed=3)
    for _ in range(9):
        first.step(batches.batch(first.step_index))
    first.save_checkpoint(tmp_path)
    resumed, _ = TopKTrainer.from_checkpoint(tmp_path / "checkpoint.pt")
    train(resumed, ShuffledBatches(x, 256, seed=3))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_shuffled_batches_cover_each_epoch_once() -> None:
    import torch

    from millm.sae.training.train import ShuffledBatches

    buffer = torch.arange(40, dtype=torch.float32).unsqueeze(1)
    batches = ShuffledBatches(buffer, 8, seed=0)
    epoch = torch.cat([batches.batch(i) for i in range(5)]).flatten()
    assert sorted(epoch.tolist()) == list(range(40))
    assert not torch.equal(epoch, torch.cat([batches.batch(i) for i in range(5, 10)]).flatten())
    assert torch.equal(ShuffledBatches(buffer, 8, seed=0).batch(7), batches.batch(7))


def test_fvu_is_zero_for_perfect_and_one_for_the_mean() -> None:
    from millm.sae.training.train import fraction_unexplained

    x = planted(n=100)
    assert float(fraction_unexplained(x, x)) == 0.0
    assert float(fraction_unexplained(x, x.mean(0).expand_as(x))) == pytest.approx(1.0)


# labels

def test_records_label_live_features_by_idf_weighted_top_tokens() -> None:
    import torch

    from millm.sae.labels import TopActivations, build_records

    texts = [" the", " rain", " storm", " cat", ","]
    tokens = torch.tensor([0, 1, 0, 2, 0, 3, 0, 4, 1, 0])  # "the" is everywhere, so it names nothing
    values = torch.tensor([[3.0, 2.0, 0.0], [2.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rows = torch.tensor([[1, 5, -1], [3, 2, -1], [8, -1, -1]])
    top = TopActivations(values, rows, torch.tensor([3, 2, 0]), total=10)
    records = build_records(top, tokens, texts, lambda r: f"row {r}")
    assert [r.index for r in records] == [0, 1]
    assert records[0].label.split(", ")[0] == "rain"
    assert set(records[0].label.split(", ")) == {"rain", "storm"}
    assert records[1].label.split(", ")[0] == "cat"
    assert records[0].frequency == pytest.approx(0.3)
    assert records[0].examples[0] == {"text": "row 1", "activation": 3.0}


def test_label_terms_prefer_words() -> None:
    from millm.sae.labels import label_terms

    assert label_terms({",": 9.0, "rain": 2.0, "wet": 1.0, "\\n": 5.0}) == ["rain", "wet", ","]


LABELS = {3: "rain, storm, weather", 7: "weather, forecast", 9: "sun, sunny", 12: "cat, kitten",
          15: "dog, puppy", 18: "dogs, barking"}


def test_search_orders_closest_fits_first() -> None:
    from millm.sae.labels import LabelIndex

    index = LabelIndex(LABELS, "test-sae")
    assert [m.index for m in index.search("weather")] == [7, 3]
    assert [m.index for m in index.search("sun")] == [9]
    assert index.search("nothing") == []


def test_resolve_takes_the_single_best_match() -> None:
    from millm.sae.labels import LabelIndex

    index = LabelIndex(LABELS, "test-sae")
    assert index.resolve("weather") == 7  # first term beats "any term"
    assert index.resolve("storm") == 3
    assert index.resolve("Kitten") == 12
    assert index.resolve("dog") == 15 and index.resolve("barking") == 18  # "dogs" only contains "dog"
    assert index.resolve("12") == 12 and index.resolve("#15") == 15
    assert index.resolve_assignments(["weather=60", "15=-20.5"]) == {7: 60.0, 15: -20.5}


def test_resolve_lists_candidates_when_ambiguous() -> None:
    from millm.sae.labels import LabelIndex

    index = LabelIndex({1: "rain, wet", 2: "rain, umbrella", 3: "snow"}, "test-sae")
    with pytest.raises(InvalidParameter) as exc:
        index.resolve("rain")
    message = exc.value.message
    assert "ambiguous" in message and "1 (rain, wet)" in message and "2 (rain, umbrella)" in message
    assert exc.value.param == "steer"
    with pytest.raises(InvalidParameter, match="matches no feature label"):
        index.resolve("volcano")
    with pytest.raises(InvalidParameter, match="FEATURE=STRENGTH"):
        index.resolve_assignments(["rain="])
    with pytest.raises(InvalidParameter, match="no labels"):
        LabelIndex({}, "bare").resolve("rain")


def test_label_index_reads_labels_json(tmp_path: Path) -> None:
    from millm.sae.labels import LabelIndex

    (tmp_path / "labels.json").write_text(json.dumps({str(k): v for k, v in LABELS.items()}))
    assert LabelIndex.load(tmp_path).labels == LABELS
    assert LabelIndex.load(tmp_path / "missing").labels == {}


# a tiny real run

def tiny_corpus(path: Path) -> Path:
    rng = random.Random(0)
    subjects = ["The rain", "My dog", "The old castle", "A cup of coffee", "The football match", "Her guitar",
                "The spaceship", "The bakery", "The river", "Our teacher", "The stock market", "A thunderstorm"]
    verbs = ["fell on", "barked at", "stood above", "warmed", "ended with", "played for", "flew past", "sold bread to"]
    objects = ["the quiet town", "the mailman", "the green valley", "my cold hands", "a late goal", "the moon"]
    lines = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(400)]
    path.write_text("\n\n".join(" ".join(lines[i:i + 4]) for i in range(0, 400, 4)))
    return path


def train_app():
    import typer

    from cli.sae_train import register

    app = typer.Typer()
    register(app)
    return app


TINY_NAME = "tiny-test-sae"


@pytest.mark.slow
@pytest.mark.model
def test_tiny_training_run_writes_an_sae_miLLM_loads_with_labels(tmp_path: Path, settings) -> None:
    from cli.common import steering_service
    from cli.main import app as millm

    app = train_app()
    out = tmp_path / "sae"
    base = ["train", "--layer", "3", "--width", "192", "--k", "8", "--tokens", "3000", "--epochs", "12",
            "--batch-size", "256", "--context", "64", "--corpus", str(tiny_corpus(tmp_path / "tiny.txt")),
            "--output", str(out)]
    args = [*base, "--name", TINY_NAME, "--eval-windows", "4"]
    try:
        _tiny_run(app, millm, out, base, args)
    finally:
        steering_service().store.delete_sae(TINY_NAME)


def _tiny_run(app, millm, out: Path, base: list[str], args: list[str]) -> None:
    from typer.testing import CliRunner

    from cli.common import steering_service
    from millm.sae.formats import load_sae

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "train.json").read_text())
    heldout = summary["heldout"]
    assert (heldout["windows"], heldout["tokens"], heldout["ce_tokens"]) == (4, 4 * 63, 4 * 63)  # --eval-windows
    assert 0 <= heldout["fvu"] < 1  # better than predicting the mean
    assert heldout["ce_zeroed"] > heldout["ce_clean"] > 0 and heldout["ce_spliced"] > 0
    assert heldout["ce_share"] == pytest.approx((heldout["ce_spliced"] - heldout["ce_clean"])
                                                / (heldout["ce_zeroed"] - heldout["ce_clean"]))
    # the reconstruction costs far less than zeroing the layer; on this tiny held-out text it may even
    # lower the loss a little (a negative share: the figure is not clamped, as the bench's is not)
    assert -0.1 < heldout["ce_share"] < 0.5
    assert 0 <= heldout["dead_fraction"] <= 1
    assert f"FVU {heldout['fvu']:.4f}" in result.output
    assert f"CE share of the zero-ablation gap {heldout['ce_share']:.2%}" in result.output
    record = steering_service().store.sae(TINY_NAME)  # registered under its name, as its id
    assert record is not None and record["name"] == TINY_NAME and record["path"] == str(out.resolve())
    assert f"registered as {TINY_NAME}" in result.output
    listed = CliRunner().invoke(millm, ["sae", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and TINY_NAME in listed.output, listed.output
    card = CliRunner().invoke(millm, ["sae", "features", TINY_NAME, "--limit", "3"])
    assert card.exit_code == 0 and "feature" in card.output, card.output
    assert summary["tokens"] >= 3000
    loaded = load_sae(out)
    assert (loaded.format, loaded.sae.architecture, loaded.sae.k) == ("saelens", "topk", 8)
    assert (loaded.sae.d_in, loaded.sae.d_sae, loaded.layer_hint) == (576, 192, 3)
    assert summary["final"]["fvu"] < 0.5 * summary["first"]["fvu"]
    labels = json.loads((out / "labels.json").read_text())
    features = [json.loads(line) for line in (out / "features.jsonl").read_text().splitlines()]
    assert summary["live_features"] == len(labels) == len(features) > 96
    assert all(labels[str(f["index"])] == f["label"] and f["label"] and f["examples"] for f in features)
    from millm.sae.cards import example_parts

    examples = [e for f in features for e in f["examples"]]  # each token of each excerpt with its value
    assert all("".join(t for t, _ in e["tokens"]) == "".join(example_parts(e["text"])) for e in examples)
    assert any(v > 0 for e in examples for _, v in e["tokens"])
    assert not (out / ".work").exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 1 and f"An SAE named '{TINY_NAME}' is already registered" in again.output
    again = CliRunner().invoke(app, [*base, "--no-register"])
    assert again.exit_code == 1 and "already holds an SAE" in again.output


def _no_model_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import millm.engine.loader

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(millm.engine.loader, "load", refuse)


@pytest.mark.parametrize("name", ["smollm2-135m-res-L10", "named by sae add"])
def test_a_taken_name_is_refused_before_any_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     name: str) -> None:
    """A name a registered SAE has (as its id, as the bundled SAEs' are, or as the name `sae add --name`
    gave it) is refused before the model loads or the output folder is made."""
    from typer.testing import CliRunner

    from cli.common import steering_service
    from millm.sae.bundled import bundled_saes

    service = steering_service()
    added = service.register_sae(bundled_saes()[0].path, name)["id"] if name == "named by sae add" else None
    _no_model_loading(monkeypatch)
    out = tmp_path / "never"
    try:
        result = CliRunner().invoke(train_app(), ["train", "--layer", "3", "--output", str(out), "--name", name])
    finally:
        if added is not None:
            service.store.delete_sae(added)
    assert result.exit_code == 1
    assert f"An SAE named '{name}' is already registered" in result.output and "--name" in result.output
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--name", "bad/name"], "'name' must be 1-64 characters"),
    (["--name", "fine", "--no-register"], "drop --no-register or --name"),
])
def test_a_bad_name_is_refused_before_any_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    _no_model_loading(monkeypatch)
    out = tmp_path / "never"
    result = CliRunner().invoke(train_app(), ["train", "--layer", "3", "--output", str(out), *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert not out.exists()


def test_rows_list_matches_or_the_first_features() -> None:
    from millm.sae.labels import LabelIndex

    index = LabelIndex(LABELS, "test-sae")
    assert index.rows("weather") == [{"index": 7, "label": "weather, forecast"},
                                     {"index": 3, "label": "rain, storm, weather"}]
    assert [r["index"] for r in index.rows(limit=2)] == [3, 7]


def test_cli_steer_values_resolve_names_in_the_sae_labels(tmp_path: Path) -> None:
    from cli.sae_train import steer_assignments

    (tmp_path / "labels.json").write_text(json.dumps({str(k): v for k, v in LABELS.items()}))
    assert steer_assignments(["123=40", "#5=-2"], None, "any-model") == {123: 40.0, 5: -2.0}
    assert steer_assignments(["weather=60", "12=1"], str(tmp_path), "any-model") == {7: 60.0, 12: 1.0}
    with pytest.raises(InvalidParameter, match="needs --sae"):
        steer_assignments(["weather=60"], None, "a-model-with-nothing-attached")
