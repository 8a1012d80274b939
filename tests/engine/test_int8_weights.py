"""int8 weights (MILLM_WEIGHTS=int8) on the CPU: close to the fp32 products, a row's product the same whatever
it is computed beside, the output projection kept fp32 and tied, refused where it cannot apply, and the real model
loaded that way still steered by its hooks."""

from __future__ import annotations

from typing import Any

import pytest

from millm.config import Settings
from millm.engine.base import numerics
from millm.errors import InvalidParameter


def tiny_llama(tied: bool = True) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


def needs_int8() -> None:
    from millm.engine.weights import can_quantize

    if not can_quantize():
        pytest.skip("this torch build has no quantized CPU backend")


@pytest.mark.parametrize("tied", [True, False])
def test_int8_layers_give_logits_close_to_fp32_and_leave_the_output_projection_fp32(tied):
    import copy

    import torch
    from torch import nn

    from millm.engine.packed import PackedLinear, pack_linears
    from millm.engine.weights import INT8, Int8Linear, quantize_layers, weights_of

    needs_int8()
    dense = tiny_llama(tied)
    model = copy.deepcopy(dense)
    assert weights_of(model) != INT8
    assert quantize_layers(model) == 2 * 7  # q, k, v, o, gate, up, down per layer; not the output layer
    assert weights_of(model) == INT8
    head = model.get_output_embeddings()
    assert type(head) is nn.Linear and (head.weight is model.get_input_embeddings().weight) == tied
    pack_linears(model)  # what the loader does next: the output layer packed in fp32
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    with torch.inference_mode():
        got, want = model(ids).logits, dense(ids).logits
    assert got.dtype == torch.float32 and not torch.equal(got, want)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    proj = model.model.layers[0].mlp.up_proj
    assert isinstance(proj, Int8Linear)
    original = dense.model.layers[0].mlp.up_proj.weight
    assert torch.allclose(proj.weight, original, atol=float(original.detach().abs().max()) / 127)


def test_a_rows_int8_product_does_not_depend_on_the_rows_beside_it():
    import torch
    from torch import nn

    from millm.engine.weights import Int8Linear

    needs_int8()
    torch.manual_seed(0)
    layer = Int8Linear(nn.Linear(576, 1536, bias=True))
    rows = torch.randn(48, 576)
    rows[5] *= 40  # one loud row: a per-tensor scale (torch's quantize_dynamic) would coarsen every other row
    with torch.inference_mode():
        together = layer(rows)
        assert all(torch.equal(layer(rows[:n]), together[:n]) for n in (1, 2, 7, 16))
        assert all(torch.equal(layer(rows[i:i + 1]), together[i:i + 1]) for i in (0, 5, 47))
        batched = layer(rows.view(6, 8, 576))  # as a batch of 6 rows of 8 positions
        assert torch.equal(batched.reshape(48, 1536), together)


def test_a_sequence_gives_the_same_logits_alone_and_beside_another():
    import copy

    import torch

    from millm.engine.weights import quantize_layers

    needs_int8()
    model = copy.deepcopy(tiny_llama())
    quantize_layers(model)
    ids = torch.tensor([[5, 17, 33, 2, 90, 41], [7, 7, 60, 12, 3, 88]])
    with torch.inference_mode():
        assert torch.equal(model(ids[:1]).logits[0], model(ids).logits[0])


def test_an_input_that_needs_a_gradient_is_multiplied_by_the_dequantised_weight():
    import torch
    from torch import nn

    from millm.engine.weights import Int8Linear

    needs_int8()
    layer = Int8Linear(nn.Linear(8, 4))
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, layer.weight.sum(0).expand(3, 8))


@pytest.mark.parametrize(("backend", "device", "dtype", "named"), [
    ("transformers", "cuda", "bfloat16", "device 'cuda'"),
    ("transformers", "cuda:1", "float32", "device 'cuda:1'"),
    ("transformers", "cpu", "bfloat16", "dtype 'bfloat16'"),
    ("llama.cpp", "cpu", "file", "the llama.cpp engine"),
])
def test_int8_is_refused_where_it_cannot_apply_naming_weights(backend, device, dtype, named):
    from millm.engine.dtypes import weights_mode

    with pytest.raises(InvalidParameter) as caught:
        weights_mode("int8", backend, device, dtype)
    assert caught.value.param == "weights" and named in caught.value.message
    assert caught.value.status == 400
    assert weights_mode("auto", backend, device, dtype) == "dtype"  # auto falls back, never refused
    assert weights_mode("dtype", backend, device, dtype) == "dtype"


def test_the_cpu_default_and_an_explicit_int8():
    from millm.engine.dtypes import CPU_WEIGHTS, weights_mode

    assert weights_mode("int8", "transformers", "cpu", "float32") == "int8"
    assert weights_mode("auto", "transformers", "cpu", "float32") == CPU_WEIGHTS


def test_int8_on_a_gguf_model_is_refused_before_anything_loads(settings: Settings):
    from millm.engine import load_engine
    from millm.engine.manager import default_preflight
    from millm.registry import resolve

    entry = resolve("SmolLM2-135M-Instruct:Q4_1", settings)
    int8 = settings.model_copy(update={"weights": "int8"})
    for refuse in (lambda: load_engine(entry, int8), lambda: default_preflight(entry, None, int8)):
        with pytest.raises(InvalidParameter) as caught:
            refuse()
        assert caught.value.param == "weights"


def test_the_cli_refuses_int8_for_a_gguf_model(fake_cli_env):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["chat", "--weights", "int8", "--model", "SmolLM2-135M-Instruct:Q4_1", "hi"])
    assert result.exit_code != 0
    assert "MILLM_WEIGHTS=int8 (--weights int8) cannot apply to the llama.cpp engine" in result.output


@pytest.fixture
def fake_cli_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """--weights sets MILLM_WEIGHTS for the process: put it back, and the settings read from it, afterwards."""
    from millm.config import get_settings

    monkeypatch.setenv("MILLM_WEIGHTS", "auto")
    yield
    monkeypatch.undo()
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def int8_engine(settings: Settings) -> Any:
    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve

    needs_int8()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings.model_copy(update={"weights": "int8"}))
    yield engine
    engine.close()


@pytest.mark.model
def test_the_bundled_model_loads_int8_with_its_output_projection_packed_and_tied(int8_engine):
    from millm.engine.packed import PackedLinear
    from millm.engine.weights import Int8Linear

    model = int8_engine.model
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 4 * model.config.num_hidden_layers + 1
    assert isinstance(model.sampling_head, Int8Linear)  # the decode loop's int8 copy of the output projection
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert int8_engine.fingerprint == "millm:SmolLM2-135M-Instruct@unrecorded:float32+int8/Q4_1:transformers"
    assert numerics(int8_engine) == "float32+int8"  # a strength measured here says so (millm.sae.measured)


@pytest.mark.model
def test_int8_rows_answer_alone_as_beside_others_and_steering_still_steers(int8_engine):
    import torch

    from millm.engine.events import Delta
    from millm.engine.params import GenerationRequest, TextPrompt
    from millm.requests.validation import sampling_params
    from millm.sae.bundled import bundled_saes
    from millm.sae.formats import load_sae

    def answers(*prompts: str) -> list[str]:
        request = GenerationRequest([TextPrompt(p) for p in prompts],
                                    sampling_params({"temperature": 0, "max_tokens": 12}))
        texts = [""] * len(prompts)
        for event in int8_engine.generate(request):
            if isinstance(event, Delta):
                texts[event.index] += event.text
        return texts

    story, other = "Once upon a time, in a village by the sea, there lived", "Name three colours:"
    alone = answers(story)[0]
    assert answers(story, other)[0] == alone and answers(other, story)[1] == alone

    bundled = next(b for b in bundled_saes() if b.id == "smollm2-135m-res-L10")
    steering = int8_engine.steering
    steering.attach(bundled.id, load_sae(bundled.path).sae, bundled.layer)
    seen: list[torch.Tensor] = []
    hook = int8_engine.model.model.layers[bundled.layer].register_forward_hook(
        lambda _m, _i, out: seen.append((out[0] if isinstance(out, tuple) else out).detach().clone()))
    try:
        steering.set_values(bundled.id, {2375: 40.0}, merge=False)  # "music, melody"
        steered = answers(story)[0]
    finally:
        hook.remove()
        steering.detach_all()
    assert steered != alone
    assert seen and all(h.dtype == torch.float32 for h in seen)  # the residual stream the hooks see is fp32


def test_v1_models_shows_the_loaded_models_fingerprint_and_a_gguf_load_under_int8_is_a_400(tmp_path):
    import asyncio

    from millm.server.app import create_app
    from tests.support.fakes import FakeEngine

    settings = Settings(home=tmp_path, weights="int8")
    settings.models_dir.mkdir(parents=True)
    (settings.models_dir / "tinyrepo.Q4_0.gguf").write_bytes(b"GGUF")
    engine = FakeEngine()
    app = create_app(settings, engine, loader=lambda target, _: pytest.fail(f"{target.id} was loaded"))

    async def scenario() -> Any:
        async with app.test_app():
            client = app.test_client()
            listed = await (await client.get("/v1/models")).get_json()
            refused = await client.post("/api/models/tinyrepo:Q4_0/load")
            return listed, refused.status_code, await refused.get_json()

    listed, status, body = asyncio.run(scenario())
    cards = {card["id"]: card for card in listed["data"]}
    assert cards[engine.model_id]["system_fingerprint"] == engine.fingerprint
    assert "system_fingerprint" not in cards["tinyrepo:Q4_0"]  # not loaded: nothing to say how it runs
    assert status == 400 and body["error"]["param"] == "weights", body


def test_a_loaded_engine_is_reused_only_under_the_weights_asked_for(monkeypatch: pytest.MonkeyPatch):
    """The process's engine cache honours MILLM_WEIGHTS: a model loaded under other weights is loaded again, and
    int8 on a GGUF model is refused even when that model is loaded already."""
    import millm.engine as engines
    from millm import local
    from millm.config import get_settings
    from millm.registry import BUNDLED_ID
    from tests.support.fakes import FakeEngine

    loads: list[str] = []

    def load(entry: Any, settings: Settings) -> FakeEngine:
        loads.append(settings.weights)
        engine = FakeEngine(entry.id)
        engine.weights = "int8" if settings.weights == "int8" else "dtype"
        return engine

    monkeypatch.setattr(engines, "load_engine", load)
    for model in (BUNDLED_ID, "SmolLM2-135M-Instruct:Q4_1"):
        monkeypatch.setitem(local.ENGINES, model, FakeEngine(model))  # loaded already, weights in the dtype
    try:
        for weights in ("dtype", "int8", "int8", "auto"):
            monkeypatch.setenv("MILLM_WEIGHTS", weights)
            get_settings.cache_clear()
            assert local.engine_for(BUNDLED_ID).weights == ("int8" if weights == "int8" else "dtype")
        assert loads == ["int8", "auto"]  # reloaded when the weights asked for changed, reused otherwise
        monkeypatch.setenv("MILLM_WEIGHTS", "int8")
        get_settings.cache_clear()
        with pytest.raises(InvalidParameter) as caught:
            local.engine_for("SmolLM2-135M-Instruct:Q4_1")
        assert caught.value.param == "weights"
    finally:
        get_settings.cache_clear()
