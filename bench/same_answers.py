"""Same answers before and after a refactor: a fixed set of greedy requests (chat and completion, one steered
through the bundled L10 SAE, one with a stop string, one with log-probabilities, one of two prompts that start
alike, one n=2, one seeded) answered on the transformers engine served alone (``engine.run_all``), on the
transformers engine through a batching ``EngineWorker`` (every request submitted at once, so those the batch
takes decode together), and on llama.cpp (the bundled GGUF file). Writes each answer's texts, finish reasons
and usage (and a scoring request's results) as JSON.

Only the public engine API is used (the builder, ``prepare``, ``Engine.run_all``, ``Engine.score``,
``EngineWorker.generate``), so the same script runs against an older checkout:

    cd /tmp/before && PYTHONPATH=/tmp/before python /work/main/bench/same_answers.py --out /tmp/answers_before.json
    cd /work/main && python bench/same_answers.py --out /tmp/answers_after.json --compare /tmp/answers_before.json

``MILLM_WEIGHTS=int8`` runs the transformers engine with int8 weights (llama.cpp as always).

With ``--compare`` it prints ``identical`` or ``different`` per request and engine, and exits 1 when any
answer differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

if os.getcwd() not in sys.path:  # the tree this is run in (its millm), as PYTHONPATH would give it
    sys.path.insert(1, os.getcwd())
os.environ.setdefault("MILLM_HOME", tempfile.mkdtemp(prefix="millm-same-answers-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MILLM_CACHE", str(Path(tempfile.gettempdir()) / "millm-test-cache"))

GGUF_ID = "SmolLM2-135M-Instruct:Q4_1"
SAE = "smollm2-135m-res-L10"
MUSIC = 2375  # "music, melody" on the bundled L10 SAE
SHARED = "Here is a short list of facts about the planets of the solar system, written for children: "

# name -> (route, body without "model", steered by MUSIC at 40)
REQUESTS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "chat_capital": ("chat", {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                              "temperature": 0, "max_tokens": 24}, False),
    "chat_system": ("chat", {"messages": [{"role": "system", "content": "You are a terse pirate."},
                                          {"role": "user", "content": "Tell me about your day."}],
                             "temperature": 0, "max_tokens": 32}, False),
    "completion_story": ("completions", {"prompt": "Once upon a time, in a village by the sea, there lived",
                                         "temperature": 0, "max_tokens": 32}, False),
    "completion_stop": ("completions", {"prompt": "Count with me: 1, 2, 3,", "stop": [" 7"],
                                        "temperature": 0, "max_tokens": 40}, False),
    "chat_steered": ("chat", {"messages": [{"role": "user", "content": "Tell me about your day."}],
                              "temperature": 0, "max_tokens": 32}, True),
    "chat_logprobs": ("chat", {"messages": [{"role": "user", "content": "Say yes or no."}],
                               "logprobs": True, "top_logprobs": 3, "max_tokens": 1}, False),
    "completion_penalties": ("completions", {"prompt": "Name three colours:", "temperature": 0, "max_tokens": 20,
                                             "frequency_penalty": 1.0, "presence_penalty": 0.5}, False),
    "completion_shared_start": ("completions", {"prompt": [SHARED + "Mars is", SHARED + "Jupiter is"],
                                                "temperature": 0, "max_tokens": 16}, False),
    "chat_n2": ("chat", {"messages": [{"role": "user", "content": "Name a fruit."}], "temperature": 0,
                         "max_tokens": 12, "n": 2}, False),
    "chat_seeded": ("chat", {"messages": [{"role": "user", "content": "Write a haiku about rain."}],
                             "temperature": 0.8, "seed": 7, "max_tokens": 24}, False),
}


def _built(engine: Any, name: str) -> Any:
    from millm.requests.builder import build_chat, build_completion

    route, body, _ = REQUESTS[name]
    build = build_chat if route == "chat" else build_completion
    return build({"model": engine.model_id, **body}, lambda _: engine.engine_name)


def _summary(events: list[Any]) -> dict[str, Any]:
    from millm.engine.events import Delta, Finish, Usage

    texts: dict[int, str] = {}
    finishes: dict[int, list[Any]] = {}
    usage = None
    for e in events:
        if isinstance(e, Delta):
            texts[e.index] = texts.get(e.index, "") + e.text
        elif isinstance(e, Finish):
            finishes[e.index] = [e.reason, e.completion_tokens]
        elif isinstance(e, Usage):
            usage = [e.prompt_tokens, e.completion_tokens]
    return {"texts": [texts.get(i, "") for i in sorted(set(texts) | set(finishes))],
            "finishes": [finishes.get(i) for i in sorted(set(texts) | set(finishes))], "usage": usage}


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {getattr(exc, 'code', '')}: {exc}"}


def _score(engine: Any, built: Any) -> dict[str, Any]:
    return {"score": repr(engine.score(built.score))}


class Steered:
    """The bundled SAE attached for the run, and the steering that the steered request is prepared with."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.steering = None
        self._context: Any = None

    def __enter__(self) -> Steered:
        target = self.engine.steering_target()
        if target is None:
            return self
        from millm.local import steering_service
        from millm.sae.bundled import register_bundled
        from millm.steering.session import chat_steering

        service = steering_service()
        register_bundled(service.store)
        self._context = chat_steering(service, target, SAE, None, {MUSIC: 40.0}, None)
        chat = self._context.__enter__()
        self.steering = getattr(chat, "steering", None) or chat.steer  # .steer: a capture from an earlier commit
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


def _prepared(engine: Any, name: str, steered: Steered) -> tuple[Any, Any]:
    from millm.config import get_settings
    from millm.local import steering_service
    from millm.requests.generation import prepare
    from millm.requests.limits import Limits

    built = _built(engine, name)
    if built.score is not None:
        return built, None
    steering = steered.steering if REQUESTS[name][2] else None
    service = steering_service() if steering is None else None
    return built, prepare(engine, built, Limits.of(get_settings()), service, steering)  # positional: any commit


def serial(engine: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Steered(engine) as steered:
        for name in REQUESTS:
            if REQUESTS[name][2] and steered.steering is None:
                out[name] = {"skipped": "not steerable here"}
                continue
            try:
                built, prepared = _prepared(engine, name, steered)
                if prepared is None:
                    out[name] = _score(engine, built)
                else:
                    out[name] = _summary(list(engine.run_all(prepared.plans)))
            except Exception as exc:
                out[name] = _error(exc)
    return out


def batched(engine: Any) -> dict[str, Any]:
    from millm.config import get_settings
    from millm.engine.decode.admission import BatchSettings
    from millm.engine.worker import EngineWorker

    worker = EngineWorker(64, BatchSettings.of(get_settings()))
    out: dict[str, Any] = {}

    async def one(name: str, built: Any, prepared: Any) -> None:
        try:
            if prepared is None:
                out[name] = await worker.call(_score, engine, built)
                return
            events = [e async for e in await worker.generate(engine, prepared.plans, prepared.check)]
            out[name] = _summary(events)
        except Exception as exc:
            out[name] = _error(exc)

    async def everything() -> None:
        with Steered(engine) as steered:
            jobs = []
            for name in REQUESTS:
                try:
                    built, prepared = _prepared(engine, name, steered)
                except Exception as exc:
                    out[name] = _error(exc)
                    continue
                jobs.append(one(name, built, prepared))
            await asyncio.gather(*jobs)

    try:
        asyncio.run(everything())
    finally:
        worker.shutdown()
    return {name: out[name] for name in REQUESTS}


def capture() -> dict[str, Any]:
    from millm.config import get_settings
    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve

    settings = get_settings()
    results: dict[str, Any] = {}
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    results["transformers_serial"] = serial(engine)
    results["transformers_batched"] = batched(engine)
    engine.close()
    # MILLM_WEIGHTS=int8 is the transformers engine's: llama.cpp runs its file's own quantization
    gguf = load_engine(resolve(GGUF_ID, settings), settings.model_copy(update={"weights": "auto"}))
    results["llama_cpp"] = serial(gguf)
    gguf.close()
    return results


def compare(after: dict[str, Any], before: dict[str, Any]) -> bool:
    same = True
    for mode in sorted(set(after) | set(before)):
        for name in REQUESTS:
            a, b = after.get(mode, {}).get(name), before.get(mode, {}).get(name)
            verdict = "identical" if a == b else "different"
            same = same and a == b
            print(f"{mode:22s} {name:26s} {verdict}")
            if a != b:
                print(f"    before: {json.dumps(b)[:300]}\n    after:  {json.dumps(a)[:300]}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, default=None, help="an earlier --out file to compare against")
    args = parser.parse_args()
    results = capture()
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    if args.compare is not None:
        before = json.loads(args.compare.read_text(encoding="utf-8"))
        sys.exit(0 if compare(results, before) else 1)


if __name__ == "__main__":
    main()
