"""``POST /api/measure`` on the session's real server: each answer's prompt-free fluency and distinct-bigram share are
``millm.research.measure``'s (what a sweep's points are made of); bad bodies are a 400 naming ``answers``."""

from __future__ import annotations

import httpx

ANSWERS = ["The sun rose over the quiet town.", "music music music music"]


def test_the_measure_parts_of_any_answers(server, engine):
    from millm.research.measure import Measure, bigram_share

    r = httpx.post(server + "/api/measure", json={"answers": ANSWERS}, timeout=120)
    assert r.status_code == 200, r.text
    expected = Measure(engine, ("",)).logprobs(ANSWERS, prompted=False)
    assert [(d["logprob"], d["tokens"]) for d in r.json()["data"]] == [(round(t / n, 4), n) for t, n in expected]
    assert [d["bigrams"] for d in r.json()["data"]] == [round(bigram_share(a), 4) for a in ANSWERS]
    for bad in ({"answers": []}, {"answers": ["x" * 20000]}, {"answers": "text"}):
        refused = httpx.post(server + "/api/measure", json=bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "answers", refused.text
