"""The client recipes of docs/serving/clients.md, run against the live server: the OpenAI SDK's ``parse()``, LangChain's
``OpenAIEmbeddings(check_embedding_ctx_length=False)`` and smolagents' structured CodeAgent (the clients that are test
dependencies)."""

from __future__ import annotations

import json
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


def test_smolagents_structured_code_agent_without_stop_parses_each_step(server):
    """The clients page's CodeAgent recipe: ``use_structured_outputs_internally=True`` sends a strict response_format
    with stop strings, a pair miLLM refuses; a model class whose ``supports_stop_parameter`` is False sends no stop
    (smolagents cuts the text itself), so each step is an enforced ``{"thought", "code"}`` document the agent parses."""
    from smolagents import AgentGenerationError, AgentParsingError, CodeAgent, OpenAIServerModel, tool

    sent: list[tuple[dict, httpx.Response]] = []

    def record(response: httpx.Response) -> None:
        sent.append((json.loads(response.request.content), response))

    class NoStopModel(OpenAIServerModel):
        @property
        def supports_stop_parameter(self) -> bool:
            return False

    @tool
    def weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: the city's name
        """
        return f"18 degrees and sunny in {city}"

    model = NoStopModel(model_id=MODEL, api_base=server + "/v1", api_key="not-needed", max_tokens=60, temperature=0,
                        client_kwargs={"http_client": httpx.Client(event_hooks={"response": [record]}, timeout=300),
                                       "max_retries": 0})
    agent = CodeAgent(tools=[weather], model=model, max_steps=1, verbosity_level=0,
                      use_structured_outputs_internally=True)
    agent.run("What is the weather in Paris?")

    steps = [body for body, _ in sent if "response_format" in body]
    assert steps and all("stop" not in body for body, _ in sent)
    assert all(body["response_format"]["json_schema"]["strict"] is True for body in steps)
    for _, response in sent:
        assert response.status_code == 200 and "X-miLLM-Ignored-Fields" not in response.headers
    acted = [s for s in agent.memory.steps if hasattr(s, "code_action") and s.model_output is not None]
    assert acted and len(acted) == len(steps)
    for step in acted:
        assert not isinstance(step.error, (AgentGenerationError, AgentParsingError))
        document = json.loads(step.model_output)
        assert set(document) == {"thought", "code"} and step.code_action and document["code"].strip()
