"""Decode speed with a cluster sensing vs none, interleaved in one run on one loaded model.

    python bench/sensing_decode.py                 # 7 rounds of 96 tokens
    python bench/sensing_decode.py --rounds 3 --tokens 32

The bundled L10 SAE is attached (steering nothing) for both. Each round decodes the same greedy request twice,
in alternating order: with no cluster sensing (the request reads nothing for sensing), and with one sensing
cluster of eight members whose thresholds no activation reaches (so every decode step reads them through the
SAE's encoder and the text stays the same). Printed: each round's tokens/s of both and their ratio, by the wall
clock and by this process's CPU time (run it with ``OMP_NUM_THREADS=1`` on a shared machine), then the medians.
"""

from __future__ import annotations

import argparse
from typing import Any

from interleaved import interleaved

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.params import ChatPrompt, GenerationRequest, SamplingParams
from millm.registry import BUNDLED_ID, resolve
from millm.sae.bundled import bundled_saes
from millm.sae.formats import load_sae
from millm.steering.documents import parse_shape
from millm.steering.sensors import sensor_for

SAE = "smollm2-135m-res-L10"
MEMBERS = (2327, 3617, 1679, 20, 1759, 2460, 757, 1718)  # the card's most frequent features
NEVER = 1e30  # a threshold no activation reaches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    bundled = next(b for b in bundled_saes() if b.id == SAE)
    att = engine.steering.attach(SAE, load_sae(bundled.path).sae, 10)
    cluster = parse_shape("cluster", {"kind": "cluster", "name": "bench", "model": BUNDLED_ID,
                                      "sae": {"id": SAE, "layer": 10, "d_sae": att.sae.d_sae},
                                      "members": [{"feature": f, "strength": 0.0, "threshold": NEVER}
                                                  for f in MEMBERS]})
    sensor = sensor_for(cluster, SAE, {})
    plan = engine.prepare(GenerationRequest(
        [ChatPrompt([{"role": "user", "content": "Write a long story about a lighthouse."}])],
        SamplingParams(temperature=0.0, max_tokens=args.tokens)))
    print(f"{args.tokens} tokens a request, {args.rounds} rounds; tokens/s with no cluster sensing, with one "
          f"({len(MEMBERS)} members)")

    def sensing(on: bool) -> Any:
        att.sensors.clear()
        if on:
            att.sensors["bench"] = sensor
        return plan

    interleaved(engine, args.rounds, ("none", lambda: sensing(False)), ("sensing", lambda: sensing(True)))
    att.sensors.clear()


if __name__ == "__main__":
    main()
