"""Swapping models under load: requests naming another model load it; during the swap, model_busy."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.live import live_server
from tests.support.waiting import wait_for, wait_running

MODEL = "SmolLM2-135M-Instruct"
TINY = "tiny-random-llama"


@pytest.fixture(scope="module")
def tiny_checkpoint(settings, engine):
    """A tiny randomly initialised Llama checkpoint in MILLM_HOME/models, with the bundled tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(engine.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=2, bos_token_id=1)
    path = settings.models_dir / TINY
    LlamaForCausalLM(config).save_pretrained(path)
    engine.tokenizer.save_pretrained(path)
    return path


def post(base, model, max_tokens=4):
    return httpx.post(base + "/v1/completions", timeout=120,
                      json={"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0})


def test_models_on_disk_are_listed(tiny_checkpoint, server):
    ids = [m["id"] for m in httpx.get(server + "/v1/models", timeout=10).json()["data"]]
    assert MODEL in ids and TINY in ids


def test_swap_waits_for_in_flight_and_refuses_during_it(tiny_checkpoint, engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as base, ThreadPoolExecutor(2) as pool:
        running = pool.submit(post, base, MODEL, 40)
        wait_running(base, running)
        swap = pool.submit(post, base, TINY)
        wait_for(lambda: httpx.get(base + "/api/health/inference", timeout=5).json()["state"] is not None,
                 "the swap to begin", swap)
        busy_same, busy_other = post(base, MODEL), post(base, TINY)
        assert running.result().status_code == 200  # the in-flight request finished on the old model
        swapped = swap.result()
        after = httpx.get(base + "/api/health/inference", timeout=5).json()
        back = post(base, MODEL)
    for busy in (busy_same, busy_other):
        assert busy.status_code == 503
        assert busy.json()["error"]["code"] == "model_busy" and busy.json()["error"]["type"] == "server_error"
        message = busy.json()["error"]["message"]  # names the model that is unloading, or the one loading
        assert f"'{MODEL}' is unloading" in message or f"'{TINY}' is loading" in message, message
    assert swapped.status_code == 200 and swapped.json()["model"] == TINY
    assert swapped.json()["system_fingerprint"].startswith(f"millm:{TINY}@unrecorded:float32/")
    assert after["model"] == TINY
    assert back.status_code == 200 and back.json()["model"] == MODEL


def test_refusals_come_before_any_load(tiny_checkpoint, engine, settings):
    from millm.server.app import create_app

    with live_server(create_app(settings, engine)) as base:
        r = httpx.post(base + "/v1/chat/completions", timeout=30,
                       json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "functions": [{}]})
        state = httpx.get(base + "/api/health/inference", timeout=5).json()
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured"
    assert state["model"] == MODEL
