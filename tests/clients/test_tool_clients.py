"""Tool calling and structured output as real clients use them, against the live server (Hypercorn on a
loopback port): instructor's default Mode.TOOLS, LangChain's bind_tools with a tool-message round trip and
with_structured_output(method="function_calling"), LlamaIndex's structured_predict, ``llm --schema``
(which streams) and the OpenAI SDK's ``parse()`` with a ``date`` field.

instructor and llama-index-llms-openai pin an older openai SDK (and jiter, rich) than the one ``llm`` needs,
so they cannot share the test extra's resolution; these tests skip where they are not installed (install them
with ``pip install --no-deps``, as the README says)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, Field, SecretStr

MODEL = "SmolLM2-135M-Instruct"


class Capital(BaseModel):
    """A country's capital city."""

    city: str = Field(max_length=30)
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]
    rank: int = Field(ge=1, le=10)


class Birthday(BaseModel):
    name: str = Field(max_length=30)
    born: dt.date


def test_instructor_tools_mode_returns_the_model(server):
    instructor = pytest.importorskip("instructor")
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=server + "/v1", api_key="not-needed", max_retries=0),
                                    mode=instructor.Mode.TOOLS)
    capital = client.chat.completions.create(
        model=MODEL, response_model=Capital, max_tokens=60, temperature=0, max_retries=0,
        messages=[{"role": "user", "content": "What is the capital of France? Give its continent and a rank."}])
    assert isinstance(capital, Capital) and capital.continent in Capital.model_fields["continent"].annotation.__args__


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather in a city."""
    return f"18 degrees {unit} and sunny in {city}"


def test_langchain_bind_tools_and_a_tool_message_round_trip(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = tool(get_weather)
    chat = ChatOpenAI(model=MODEL, base_url=server + "/v1", api_key=SecretStr("not-needed"), temperature=0,
                      max_tokens=60, max_retries=0)
    question = HumanMessage("What is the weather in Paris, in celsius?")
    called = chat.bind_tools([weather], tool_choice="get_weather").invoke([question])
    [call] = called.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"} and call["id"].startswith("call_")
    result = ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = chat.bind_tools([weather]).invoke([question, called, result])
    assert answer.content or answer.tool_calls
    structured = chat.with_structured_output(Capital, method="function_calling").invoke(
        "What is the capital of Japan? Give its continent and a rank.")
    assert isinstance(structured, Capital)
    streamed = list(chat.bind_tools([weather], tool_choice="required").stream([question]))
    chunks = streamed[0]
    for piece in streamed[1:]:
        chunks += piece
    assert chunks.tool_calls[0]["name"] == "get_weather" and set(chunks.tool_calls[0]["args"]) == {"city", "unit"}


def test_llamaindex_structured_predict_with_its_defaults(server):
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.prompts import PromptTemplate
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=MODEL, api_base=server + "/v1", api_key="not-needed", is_chat_model=True,
                     is_function_calling_model=True, context_window=8192, max_tokens=60, temperature=0, max_retries=0)
    capital = llm.structured_predict(Capital, PromptTemplate("What is the capital of {country}? Give its continent "
                                                             "and a rank."), country="Italy")
    assert isinstance(capital, Capital)


def test_llm_cli_schema_streams_a_valid_document(server, tmp_path: Path):
    """``llm --schema`` streams by default: the schema is a streamed response_format."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: smol\n  model_name: {MODEL}\n  api_base: {server}/v1\n  supports_schema: true\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "not-needed"}
    done = subprocess.run([sys.executable, "-m", "llm", "-m", "smol", "--schema", "name, born: date of birth",
                           "-o", "max_tokens", "80", "-o", "temperature", "0", "--no-log",
                           "Name a famous scientist and their date of birth."],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"name", "born"}


def test_openai_sdk_parse_with_a_date_field(client):
    completion = client.chat.completions.parse(
        model=MODEL, max_tokens=60, temperature=0, response_format=Birthday,
        messages=[{"role": "user", "content": "Name a famous scientist and their date of birth."}])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Birthday)
    assert isinstance(choice.message.parsed.born, dt.date)
    with client.chat.completions.stream(
            model=MODEL, max_tokens=60, temperature=0, response_format=Birthday,
            messages=[{"role": "user", "content": "Name a famous painter and their date of birth."}]) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Birthday)


class Landing(BaseModel):
    """Pydantic's default: extra keys are ignored on input, and its schema leaves additionalProperties unset."""

    when: str = Field(max_length=30)
    where: str = Field(max_length=30)


class StrictLanding(Landing, extra="forbid"):
    pass


def test_a_pydantic_schema_without_strict_parses_with_no_undeclared_keys(client):
    schema = Landing.model_json_schema()
    assert "additionalProperties" not in schema
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=80, temperature=0.8, seed=3,
        messages=[{"role": "user", "content": "When and where did the first moon landing happen?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "landing", "schema": schema}})
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    StrictLanding.model_validate_json(choice.message.content)  # no key the model was not asked for


def test_smolagents_tool_calling_agent_runs_with_its_defaults(server):
    """smolagents' ToolCallingAgent sends stop ["Observation:", "Calling tools:"] and tool_choice "required"
    with every step; its steps must be answered, with calls it can run."""
    from smolagents import AgentGenerationError, AgentMaxStepsError, OpenAIServerModel, ToolCallingAgent, tool

    asked: list[str] = []

    @tool
    def weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: the city's name
        """
        asked.append(city)
        return f"18 degrees and sunny in {city}"

    model = OpenAIServerModel(model_id=MODEL, api_base=server + "/v1", api_key="not-needed", max_tokens=60,
                              temperature=0)
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=2, verbosity_level=0)
    agent.run("What is the weather in Paris?")
    steps = [s for s in agent.memory.steps if hasattr(s, "tool_calls")]
    assert not any(isinstance(s.error, AgentGenerationError) for s in steps)  # no step refused or unparsed
    acted = [s for s in steps if not isinstance(s.error, AgentMaxStepsError)]  # the last is the agent's own
    assert len(acted) == 2 and all(s.tool_calls for s in acted)  # each step a call the agent parsed and ran
    assert {c.name for s in acted for c in s.tool_calls} <= {"weather", "final_answer"}
    assert asked and set(asked) <= {"Paris"}


def test_open_webui_s_shape_answers(server):
    """What Open WebUI sends with native function calling: its built-in tools on every message, streamed,
    with stream_options. It must answer (text or a call), never refuse."""
    tools = [{"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}},
        "required": ["query"]}}} for name, description in (("search_web", "Search the web"),
                                                            ("query_knowledge_files", "Search the knowledge base"))]
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, "tools": tools,
            "messages": [{"role": "user", "content": "Hello! How are you?"}], "max_tokens": 30}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200 and "X-miLLM-Ignored-Fields" not in r.headers
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] > 0
