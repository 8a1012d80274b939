"""Scoring throughput: ``millm score`` vs a naive loop calling the HF model one prompt at a time.

    python bench/score.py [--prompts 256] [--batch-size 32]

Both score the same short prompts on the bundled model; the naive loop is what a judge script
without miLLM does (one forward per prompt, log-softmax of the last position). Prints rows/s of both.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from typer.testing import CliRunner

from cli.main import app
from millm.config import get_settings
from millm.engine import load_engine
from millm.registry import resolve

TEMPLATES = ["Is {} a fruit? Answer:", "The colour of {} is", "Q: How big is a {}?\nA:", "{} is spelled"]
WORDS = ["apple", "carrot", "stone", "whale", "cloud", "violin", "pepper", "glacier"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    prompts = [TEMPLATES[i % len(TEMPLATES)].format(WORDS[(i // len(TEMPLATES)) % len(WORDS)] + f" #{i}")
               for i in range(args.prompts)]

    settings = get_settings()
    engine = load_engine(resolve(settings.default_model, settings), settings)
    model, tok = engine.model, engine.tokenizer
    with torch.inference_mode():  # warm up
        model(torch.tensor([tok(prompts[0])["input_ids"]]))
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            logits = model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1]
            torch.log_softmax(logits.float(), -1).topk(5)
    naive = args.prompts / (time.perf_counter() - start)

    import cli.common

    cli.common._engines[engine.model_id] = engine  # the CLI path reuses the loaded model
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        start = time.perf_counter()
        result = CliRunner().invoke(app, ["score", str(src), "-o", str(out), "--batch-size", str(args.batch_size),
                                          "--logprobs", "5"], env={**os.environ, "COLUMNS": "120"})
        ours = args.prompts / (time.perf_counter() - start)
        assert result.exit_code == 0, result.output
        assert len(out.read_text().splitlines()) == args.prompts
    print(f"{engine.model_id}, {args.prompts} short prompts, {torch.get_num_threads()} threads")
    print(f"naive HF loop, one prompt at a time: {naive:7.1f} rows/s")
    print(f"millm score --batch-size {args.batch_size}:       {ours:7.1f} rows/s")
    print(f"speed-up: {ours / naive:.2f}x")


if __name__ == "__main__":
    main()
