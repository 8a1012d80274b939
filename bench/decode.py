"""Greedy decode speed: miLLM's own loop vs ``model.generate`` on the same model, prompt and length, and
vs the serial loop miLLM had before its scheduler became its one decode loop (a DynamicCache prefill,
then one forward a token, each token detokenised as it comes), rebuilt here as the baseline.

    python bench/decode.py [--tokens 128] [--rounds 3]

Prints tokens/s for each and the ratios; rounds are interleaved, medians reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Usage
from millm.engine.params import GenerationRequest, TextPrompt
from millm.registry import resolve
from millm.requests.validation import sampling_params

PROMPT = "Once upon a time, in a village by the sea, there lived"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    settings = get_settings()
    engine = load_engine(resolve(args.model or settings.default_model, settings), settings)
    model, tok = engine.model, engine.tokenizer
    ids = torch.tensor([engine.tokenize(TextPrompt(PROMPT))], device=engine.device)
    request = GenerationRequest([TextPrompt(PROMPT)], sampling_params({"temperature": 0, "max_tokens": args.tokens}))

    def run_millm() -> tuple[float, int]:
        start = time.perf_counter()
        usage = [e for e in engine.generate(request) if isinstance(e, Usage)][0]
        return time.perf_counter() - start, usage.completion_tokens

    def run_cache_loop() -> tuple[float, int]:
        from transformers import DynamicCache

        from millm.engine.decode.output import ChoiceOutput

        start = time.perf_counter()
        output = ChoiceOutput(tok, (), engine.stop_ids)
        with torch.inference_mode():
            cache = DynamicCache()
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :].float()
            for _ in range(args.tokens):
                token = torch.argmax(logits, dim=-1)
                output.feed(int(token))
                logits = model(input_ids=token.view(1, 1), cache=cache, use_cache=True,
                               logits_to_keep=1).logits[:, -1, :].float()
        return time.perf_counter() - start, args.tokens

    def run_generate() -> tuple[float, int]:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        return time.perf_counter() - start, out.shape[1] - ids.shape[1]

    run_millm(), run_generate(), run_cache_loop()  # warm up
    ours, theirs, loops = [], [], []
    for _ in range(args.rounds):
        for rates, run in ((ours, run_millm), (theirs, run_generate), (loops, run_cache_loop)):
            t, n = run()
            rates.append(n / t)
    o, g, c = statistics.median(ours), statistics.median(theirs), statistics.median(loops)
    print(f"model {engine.model_id} on {engine.device} ({engine.dtype}), {args.tokens} greedy tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"transformers generate: {g:8.1f} tok/s")
    print(f"miLLM engine:          {o:8.1f} tok/s")
    print(f"pre-scheduler loop:    {c:8.1f} tok/s")
    print(f"ratio miLLM/generate:  {o / g:8.2f}x")
    print(f"ratio miLLM/pre-scheduler loop: {o / c:5.2f}x")


if __name__ == "__main__":
    main()
