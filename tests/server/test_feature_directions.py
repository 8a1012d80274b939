"""``GET /api/saes/{id}/features/{index}/directions`` on the session's real server: the tokens a feature's decoder
row promotes and suppresses through the unembedding (with the logits the engine computes), and its nearest features
by decoder cosine at its layer."""

from __future__ import annotations

import httpx

SAE = "smollm2-135m-res-L10"
MUSIC = 2375


def test_promoted_suppressed_and_nearest_of_an_attached_feature(server, engine):
    import torch

    assert httpx.post(f"{server}/api/saes/{SAE}/attach", json={}).status_code == 200
    try:
        r = httpx.get(f"{server}/api/saes/{SAE}/features/{MUSIC}/directions?k=5")
        assert r.status_code == 200, r.text
        body = r.json()
        row = engine.steering.attachments[SAE].sae.W_dec[MUSIC].float()
        logits = engine.unembed(row)
        assert [t["id"] for t in body["promotes"]] == logits.topk(5).indices.tolist()
        assert [t["id"] for t in body["suppresses"]] == (-logits).topk(5).indices.tolist()
        assert body["promotes"][0]["logit"] == round(float(logits.max()), 4)
        assert body["promotes"][0]["token"] == engine.token_text(body["promotes"][0]["id"])
        cosines = [n["cosine"] for n in body["nearest"]]
        assert len(cosines) == 5 and cosines == sorted(cosines, reverse=True) and (SAE, MUSIC) not in [
            (n["sae"], n["index"]) for n in body["nearest"]]
        decoder = engine.steering.attachments[SAE].sae.W_dec.float()
        best = torch.nn.functional.cosine_similarity(decoder, row[None], dim=-1)
        best[MUSIC] = -2
        assert body["nearest"][0]["index"] == int(best.argmax()) and body["layer"] == 10
    finally:
        httpx.post(f"{server}/api/saes/{SAE}/detach")


def test_an_unattached_sae_is_read_from_its_files_and_bad_asks_are_refused(server):
    body = httpx.get(f"{server}/api/saes/{SAE}/features/{MUSIC}/directions?k=3").json()
    assert len(body["promotes"]) == 3 and all(n["sae"] == SAE for n in body["nearest"])
    asks = ((f"{MUSIC}/directions?k=0", "k"), (f"{MUSIC}/directions?k=x", "k"), ("99999/directions", "index"))
    for ask, param in asks:
        r = httpx.get(f"{server}/api/saes/{SAE}/features/{ask}")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_features_histogram_over_the_shipped_corpus_counts_what_its_sae_reads_there(server, engine):
    from millm.sae.activations import collect
    from millm.sae.corpus_histogram import BINS, CONTEXT, WINDOWS
    from millm.sae.formats import load_sae
    from millm.sae.training.corpus import python_documentation, split_documents, token_windows

    r = httpx.get(f"{server}/api/saes/{SAE}/features/{MUSIC}/histogram", timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    record = httpx.get(f"{server}/api/saes/{SAE}").json()
    sae = load_sae(record["path"]).sae
    windows = token_windows(engine.tokenizer, split_documents(python_documentation(), 0.1, 0)[1], CONTEXT, WINDOWS)
    values = sae.encode(collect(engine.model, windows, 10))[:, MUSIC]
    fired = values[values != 0]
    assert body["tokens"] == WINDOWS * (CONTEXT - 1) and body["firing"] == len(fired)
    assert len(body["bins"]) == BINS and sum(b["count"] for b in body["bins"]) == body["firing"]
    if len(fired):
        assert body["bins"][-1]["high"] == round(float(fired.max()), 4) and body["bins"][-1]["count"] >= 1
    r = httpx.get(f"{server}/api/saes/{SAE}/features/99999/histogram")
    assert r.status_code == 400 and r.json()["error"]["param"] == "index"
