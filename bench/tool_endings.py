"""How often ``tool_choice: "required"`` with a client's default settings ends in usable tool calls.

    python bench/tool_endings.py [--before /tmp/base] [--prompts 20] [--max-tokens 160]

Sends 20 prompts x 3 tool sets through the official OpenAI SDK with ``tool_choice="required"`` and nothing
else a client would not send by default (``parallel_tool_calls`` left to its default, true; the default
temperature, 1.0), each prompt with its own seed so the two servers sample alike. A request counts when
it ends ``finish_reason: "tool_calls"`` and every call's arguments parse and satisfy the tool's schema.

Runs ``millm serve`` from this checkout and, with ``--before``, from another checkout of the repository
(the commit before a change), one after the other on loopback ports, each in a temporary MILLM_HOME;
prints both shares and what the failures ended with.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from openai import OpenAI

HERE = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"
# the server of a checkout runs that checkout's code: an editable install's import hook would map ``millm`` to
# the installed one whatever the path says, so it goes first
LAUNCH = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
          "from cli.main import app; app()")


def function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOL_SETS: dict[str, list[dict[str, Any]]] = {
    "weather": [function("get_weather", "The current weather in a city",
                         {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"])],
    "search+math": [function("search_web", "Search the web", {"query": {"type": "string"}}, ["query"]),
                    function("calculate", "Evaluate an arithmetic expression",
                             {"expression": {"type": "string"}}, ["expression"])],
    "calendar": [function("create_event", "Put an event in the calendar",
                          {"title": {"type": "string"}, "date": {"type": "string"}, "hours": {"type": "number"}},
                          ["title", "date"]),
                 function("list_events", "The events of one day", {"date": {"type": "string"}}, ["date"]),
                 function("send_email", "Send an email", {"to": {"type": "string"}, "body": {"type": "string"}},
                          ["to", "body"])],
}
PROMPTS = (
    "What is the weather like in Paris today?", "Is it going to rain in London?", "How warm is it in Madrid?",
    "What is 17 times 23?", "Find me a recipe for pancakes.", "Who won the football world cup in 2018?",
    "Add a dentist appointment on 2024-05-02.", "What do I have planned for Friday?",
    "Email Sam that I will be late.", "Should I take an umbrella in Berlin?", "How much is 2 to the power 10?",
    "Look up the height of Mount Everest.", "Schedule a team meeting tomorrow for two hours.",
    "Remind me of my events on 2024-06-01.", "Tell Alex the report is ready.", "Is it snowing in Oslo?",
    "What is the square root of 144?", "Search for the best hiking trails near Denver.",
    "Book lunch with Maria on Monday.", "What's the temperature in Tokyo in fahrenheit?",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(tree: Path, home: str) -> tuple[subprocess.Popen[bytes], str]:
    """``millm serve`` from the checkout ``tree`` (its own code first on the path), once it answers."""
    port = free_port()
    env = {**os.environ, "MILLM_HOME": home, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "serve", "--port", str(port)],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/api/health", timeout=1)
            return proc, base
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"millm serve from {tree} did not answer")


def outcome(client: OpenAI, prompt: str, tools: list[dict[str, Any]], seed: int, max_tokens: int) -> str:
    """"ok", or what the request ended with instead."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           tools=tools, tool_choice="required", seed=seed,  # type: ignore[arg-type]
                                           max_tokens=max_tokens)
    choice = reply.choices[0]
    if choice.finish_reason != "tool_calls":
        return f"finish_reason {choice.finish_reason}"
    for call in choice.message.tool_calls or []:
        try:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])  # type: ignore[union-attr]
        except (ValueError, jsonschema.ValidationError):
            return "invalid arguments"
    return "ok" if choice.message.tool_calls else "no call"


def measure(tree: Path, prompts: int, max_tokens: int) -> tuple[float, Counter[str], int]:
    """(share of requests ending in valid calls, how the others ended, calls per successful request)."""
    with tempfile.TemporaryDirectory(prefix="millm-bench-") as home:
        proc, base = serve(tree, home)
        try:
            client = OpenAI(base_url=base + "/v1", api_key="none", timeout=600)
            ends: Counter[str] = Counter()
            for tools in TOOL_SETS.values():
                for seed, prompt in enumerate(PROMPTS[:prompts]):
                    ends[outcome(client, prompt, tools, seed, max_tokens)] += 1
        finally:
            proc.terminate()
            proc.wait()
    total = sum(ends.values())
    return ends["ok"] / total, ends, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="another checkout to measure first (the commit before)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1),
                        metavar=f"1-{len(PROMPTS)}")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    trees = ([("before", args.before.resolve())] if args.before else []) + [("after", HERE)]
    for name, tree in trees:
        share, ends, total = measure(tree, args.prompts, args.max_tokens)
        others = ", ".join(f"{k}: {v}" for k, v in ends.items() if k != "ok") or "none"
        print(f"{name:6} {share:6.1%} of {total} required requests end tool_calls with valid arguments "
              f"(others: {others})", flush=True)


if __name__ == "__main__":
    main()
