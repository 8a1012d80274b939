"""GPU smoke test and decode speed on a random-weight Llama (no weights to download).

    python bench/gpu_smoke.py --tokenizer DIR [--hidden 2048 --layers 16]

Builds a random Llama with the given tokenizer, saves it as a checkpoint, loads it through miLLM's
registry (CUDA and bfloat16 where present), then checks on that device: greedy and seeded decoding,
steering that changes the text and restores it byte for byte, read-outs, batched scoring, embeddings
under steering, a JSON constraint; and prints decode tokens/s against ``model.generate``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from millm.config import Settings
    from millm.engine import load_engine
    from millm.engine.events import Activations, Usage
    from millm.engine.params import ChatPrompt, GenerationRequest, TextPrompt
    from millm.registry import resolve
    from millm.requests.validation import sampling_params
    from millm.sae.model import SAE
    from millm.structured.schema import check_response_format

    home = Path(tempfile.mkdtemp())
    ckpt = home / "models" / "random-llama"
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=2, bos_token_id=1)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    settings = Settings(home=home)
    engine = load_engine(resolve(str(ckpt), settings), settings)
    params = sum(p.numel() for p in engine.model.parameters()) / 1e9
    print(f"device {engine.device}, dtype {engine.dtype}, params {params:.2f} B")

    def text(prompt="Once upon a time", **fields):
        fields = {"temperature": 0, "max_tokens": 24} | fields
        out = []
        for e in engine.generate(GenerationRequest([TextPrompt(prompt)], sampling_params(fields))):
            if hasattr(e, "text"):
                out.append(e.text)
        return "".join(out)

    results = {}
    plain = text()
    results["greedy repeatable"] = plain == text()
    results["seeded repeatable"] = text(temperature=1.0, seed=3) == text(temperature=1.0, seed=3)
    g = torch.Generator().manual_seed(0)
    W_dec = torch.nn.functional.normalize(torch.randn(4096, args.hidden, generator=g), dim=-1)
    sae = SAE(W_enc=W_dec.T.contiguous(), b_enc=torch.zeros(4096), W_dec=W_dec, b_dec=torch.zeros(args.hidden))
    engine.steering.attach("sae_gpu", sae, args.layers // 2)
    engine.steering.set_values("sae_gpu", {5: 200.0}, merge=False)
    results["steering changes text"] = text() != plain
    events = list(engine.generate(GenerationRequest([TextPrompt("Hello there")], sampling_params(
        {"temperature": 0, "max_tokens": 4}), readout={"positions": "all", "top_k": 4})))
    acts = next(e for e in events if isinstance(e, Activations)).body
    results["read-out positions"] = len(acts["positions"]) == len(engine.tokenize(TextPrompt("Hello there"))) + 3
    emb_steered, _ = engine.embed(["a sentence"])
    engine.steering.clear()
    emb_plain, _ = engine.embed(["a sentence"])
    results["embeddings unsteered"] = emb_steered == emb_plain
    results["steering restores byte for byte"] = text() == plain
    ids = [engine.tokenize(TextPrompt(p)) for p in ("a", "a longer prompt here", "mid size")]
    batch = engine.next_token_logits(ids, 32)
    single = torch.cat([engine.next_token_logits([i]) for i in ids])
    results["batched scoring close"] = bool(torch.allclose(batch, single, atol=0.1, rtol=0.05))
    try:
        constraint = check_response_format({"type": "json_object"})
        out = "".join(e.text for e in engine.generate(GenerationRequest(
            [ChatPrompt([{"role": "user", "content": "json"}])], sampling_params({"temperature": 0, "max_tokens": 16}),
            constraint=constraint)) if hasattr(e, "text"))
        results["constrained starts an object"] = out.startswith("{")
    except Exception as exc:  # report, do not stop the smoke run
        results[f"constrained failed: {exc!r}"[:120]] = False
    print(json.dumps(results, indent=1))

    request = GenerationRequest([TextPrompt("Once upon a time")], sampling_params({"temperature": 0,
                                                                                    "max_tokens": args.tokens}))
    model = engine.model
    prompt = torch.tensor([engine.tokenize(TextPrompt("Once upon a time"))], device=engine.device)

    def ours() -> float:
        torch.cuda.synchronize() if engine.device.type == "cuda" else None
        start = time.perf_counter()
        n = [e for e in engine.generate(request) if isinstance(e, Usage)][0].completion_tokens
        torch.cuda.synchronize() if engine.device.type == "cuda" else None
        return n / (time.perf_counter() - start)

    def theirs() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False)
        torch.cuda.synchronize() if engine.device.type == "cuda" else None
        return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start)

    ours(), theirs()
    base = [theirs() for _ in range(3)]
    mine = [ours() for _ in range(3)]
    engine.steering.set_values("sae_gpu", {i * 7: 2.0 for i in range(16)}, merge=False)
    steered = [ours() for _ in range(3)]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = torch.cuda.get_device_properties(0).total_memory and 4.8e12 if engine.device.type == "cuda" else None
    med = lambda xs: sorted(xs)[1]  # noqa: E731
    print(f"model.generate: {med(base):.1f} tok/s; miLLM: {med(mine):.1f} tok/s ({med(mine)/med(base):.2f}x); "
          f"miLLM steering 16 features: {med(steered):.1f} tok/s ({med(steered)/med(mine):.3f} of unsteered)")
    if bw:
        print(f"share of the memory-bandwidth limit (4.8 TB/s, {weights/1e9:.2f} GB of weights): "
              f"generate {med(base)*weights/bw*100:.1f}%, miLLM {med(mine)*weights/bw*100:.1f}%")


if __name__ == "__main__":
    main()
