"""Steering a GGUF model through llama.cpp's control vectors (MILLM_GGUF_STEERING), against the transformers engine.

    python bench/gguf_steering.py [--feature 2375] [--strengths 20,40,60] [--tokens 48] [--rounds 5]

(1) Agreement: one labelled feature of the bundled SAE smollm2-135m-res-L10 (2375, "music, melody") is steered at
a few strengths on both engines (the bundled model: its Q4_1 file on llama.cpp, the same file dequantised on
transformers), greedy, over a few chat prompts. Each generated text is then read by the transformers engine,
unsteered: the feature's mean activation over the text's tokens at layer 10. The rise over the unsteered text's
activation is printed for both engines, with GGUF's rise / transformers' rise (the target: at least 0.5).

(2) Speed: greedy decode tokens/s (first token to last) of the GGUF engine steered vs unsteered, rounds
interleaved, medians, with the unsteered figure of an engine without the setting as the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.events import Delta
from millm.engine.llama_engine import LlamaCppEngine
from millm.engine.params import ChatPrompt, GenerationRequest, TextPrompt
from millm.registry import BUNDLED_ID, resolve
from millm.requests.validation import sampling_params
from millm.sae.bundled import BUNDLED_DIR
from millm.sae.formats import load_sae

GGUF = "SmolLM2-135M-Instruct:Q4_1"
SAE = "smollm2-135m-res-L10"
PROMPTS = ["Tell me about your day.", "Write a sentence about the sea.", "Describe your favourite food.",
           "What did you do last weekend?"]
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def generate(engine: Any, messages: list[dict[str, str]], tokens: int) -> tuple[str, float | None, int]:
    """Greedy text, its decode tokens/s (first token to last; None under two tokens) and its token count."""
    request = GenerationRequest([ChatPrompt(messages)], sampling_params({"temperature": 0, "max_tokens": tokens}))
    parts, first, count = [], None, 0
    for event in engine.run(engine.prepare(request)):
        if isinstance(event, Delta):
            parts.append(event.text)
        if hasattr(event, "completion_tokens") and not isinstance(event, Delta):
            count = int(event.completion_tokens)
        if first is None and isinstance(event, Delta):
            first = time.perf_counter()
    end = time.perf_counter()
    rate = (count - 1) / (end - first) if first is not None and count > 1 and end > first else None
    return "".join(parts), rate, count


def feature_mean(hf: Any, text: str, layer: int, feature: int) -> float:
    """The feature's mean activation over ``text``'s tokens, read at resid_post of ``layer`` on the transformers
    engine with nothing steering."""
    ids = hf.tokenize(TextPrompt(text, add_special_tokens=False))
    if not ids:
        return 0.0
    att = next(a for a in hf.steering.attachments.values() if a.layer == layer)
    seen: list[torch.Tensor] = []
    handle = hf.steering.layers[layer].register_forward_hook(
        lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad(), hf.steering.suppressed():
            hf.model(torch.tensor([ids], device=hf.model.device))
    finally:
        handle.remove()
    acts = att.sae.encode(seen[0].reshape(-1, seen[0].shape[-1]), torch.tensor([feature], device=seen[0].device))
    return float(acts.float().mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--feature", type=int, default=2375)
    parser.add_argument("--strengths", default="20,40,60")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--speed-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--speed-only", action="store_true", help="skip the agreement part (and the transformers load)")
    args = parser.parse_args()
    strengths = [float(s) for s in args.strengths.split(",")]
    settings = get_settings()
    loaded = load_sae(BUNDLED_DIR / SAE)
    layer = int(loaded.layer_hint or 10)

    hf = None if args.speed_only else load_engine(resolve(BUNDLED_ID, settings), settings)
    settings.gguf_steering = True
    gguf = LlamaCppEngine.load(resolve(GGUF, settings), settings)
    settings.gguf_steering = False
    plain = LlamaCppEngine.load(resolve(GGUF, settings), settings)  # the setting off: the unsteered baseline
    targets = {"llama.cpp": gguf.steering_target(), **({"transformers": hf.steering_target()} if hf else {})}
    for target in targets.values():
        assert target is not None
        target.steering.attach(SAE, loaded.sae, layer)
    if hf is not None:
        agreement(hf, gguf, targets, layer, args, strengths)
    speed(gguf, plain, targets, args)
    for engine in (gguf, plain):
        engine.close()


def agreement(hf: Any, gguf: Any, targets: dict[str, Any], layer: int, args: Any, strengths: list[float]) -> None:
    """The feature's rise on each engine's steered text over its unsteered text, read on transformers."""
    print(f"feature {args.feature} of {SAE} (layer {layer}), greedy, {len(PROMPTS)} prompts x {args.tokens} tokens; "
          "mean activation of each engine's text, read on transformers unsteered")
    means: dict[str, dict[float, float]] = {}
    for name, engine in (("transformers", hf), ("llama.cpp", gguf)):
        steering = targets[name].steering
        texts: dict[float, list[str]] = {}
        for strength in [0.0, *strengths]:
            steering.set_values(SAE, {args.feature: strength} if strength else {}, merge=False)
            texts[strength] = [generate(engine, [{"role": "user", "content": p}], args.tokens)[0] for p in PROMPTS]
        steering.clear()
        means[name] = {s: statistics.fmean(feature_mean(hf, t, layer, args.feature) for t in ts)
                       for s, ts in texts.items()}
        print(f"  {name:12s} text at {strengths[-1]:g}: {texts[strengths[-1]][0][:90]!r}")
    print(f"  {'strength':>8s} {'tf mean':>8s} {'tf rise':>8s} {'gguf mean':>9s} {'gguf rise':>9s} {'gguf/tf':>7s}")
    print(f"  {0:8g} {means['transformers'][0.0]:8.3f} {'':8s} {means['llama.cpp'][0.0]:9.3f}")
    for strength in strengths:
        tf_rise = means["transformers"][strength] - means["transformers"][0.0]
        gg_rise = means["llama.cpp"][strength] - means["llama.cpp"][0.0]
        verdict = (f"{gg_rise / tf_rise:7.2f}" + ("" if gg_rise >= tf_rise / 2 else "  < 0.5") if tf_rise > 0
                   else "    n/a  (no rise on transformers at this strength)")
        print(f"  {strength:8g} {means['transformers'][strength]:8.3f} {tf_rise:8.3f} "
              f"{means['llama.cpp'][strength]:9.3f} {gg_rise:9.3f} {verdict}")


def speed(gguf: Any, plain: Any, targets: dict[str, Any], args: Any) -> None:
    """Decode tok/s of the steered engine steered and unsteered, and of an engine without the setting."""
    steering = targets["llama.cpp"].steering
    strength = 40.0
    rates: dict[str, list[float]] = {"setting off": [], "unsteered": [], "steered": []}
    counts: dict[str, list[int]] = {k: [] for k in rates}
    for _ in range(args.rounds):
        for case in rates:
            engine = plain if case == "setting off" else gguf
            steering.set_values(SAE, {args.feature: strength} if case == "steered" else {}, merge=False)
            _, rate, count = generate(engine, STORY, args.speed_tokens)
            if rate is not None:
                rates[case].append(rate)
                counts[case].append(count)
    steering.clear()
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(f"decode tok/s (first token to last), median of {args.rounds} interleaved rounds, up to "
          f"{args.speed_tokens} tokens, steered at {strength:g}:")
    for case, value in median.items():
        spread = f"{min(rates[case]):.1f}-{max(rates[case]):.1f}"
        print(f"  {case:12s} {value:7.1f} tok/s  (range {spread}; tokens per run: {sorted(set(counts[case]))})")
    print(f"  steered / unsteered     {median['steered'] / median['unsteered']:.3f}  (target >= 0.95)")
    print(f"  unsteered / setting off {median['unsteered'] / median['setting off']:.3f}")


if __name__ == "__main__":
    main()
