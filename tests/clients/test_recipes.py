"""The README's client recipes, run against the live server: the OpenAI SDK's ``parse()`` and LangChain's
``OpenAIEmbeddings(check_embedding_ctx_length=False)`` (the clients that are test dependencies)."""

from __future__ import annotations

from typing import Literal

import httpx
from pydantic import BaseModel, Field, SecretStr

MODEL = "SmolLM2-135M-Instruct"


class Capital(BaseModel):
    city: str
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]
    rank: int = Field(ge=1, le=10)


def server_embeddings(server: str, texts: list[str]) -> list[list[float]]:
    r = httpx.post(f"{server}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=120)
    assert r.status_code == 200
    return [row["embedding"] for row in r.json()["data"]]


def test_openai_sdk_parse_returns_the_pydantic_object(client):
    """``client.chat.completions.parse(response_format=Model)``: a strict json_schema, enforced while decoding."""
    completion = client.chat.completions.parse(
        model=MODEL, max_tokens=40, temperature=0, response_format=Capital,
        messages=[{"role": "user",
                   "content": "What is the capital of France? Give the city, its continent and a rank from 1 to 10."}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.refusal is None
    parsed = choice.message.parsed
    assert isinstance(parsed, Capital)
    assert parsed == Capital.model_validate_json(choice.message.content or "")
    assert parsed.city == "Paris" and parsed.continent == "Europe" and 1 <= parsed.rank <= 10


def test_langchain_embeddings_without_the_ctx_length_check_equal_the_server_vectors(server):
    """With ``check_embedding_ctx_length=False`` LangChain sends the text itself, not OpenAI tokenizer ids
    (which would decode to other tokens here), so its vectors are the server's for the same text."""
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=MODEL, base_url=server + "/v1", api_key=SecretStr("not-needed"),
                                  check_embedding_ctx_length=False, max_retries=0)
    texts = ["The capital of France is Paris.", "Bees make honey"]
    assert embeddings.embed_query(texts[0]) == server_embeddings(server, texts[:1])[0]
    assert embeddings.embed_documents(texts) == server_embeddings(server, texts)
