"""Give an SAE's feature cards per-token values: every example of its ``features.jsonl`` read token by token
(``millm.sae.example_tokens``), the file rewritten in place; prints the time it took and the file's size.

    python bench/card_tokens.py millm/sae/bundled/smollm2-135m-res-L10 millm/sae/bundled/smollm2-135m-res-L20

``millm sae train`` writes them as it labels; this adds them to cards made before (how the bundled SAEs' cards
got theirs). The model is the SAE's own (the bundled one, on the transformers engine, on the CPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from millm.config import get_settings
from millm.engine import load_engine
from millm.engine.transformers_engine import TransformersEngine
from millm.registry import BUNDLED_ID, resolve
from millm.sae.cards import FEATURES_FILE
from millm.sae.example_tokens import add_tokens_to_file
from millm.sae.formats import load_sae


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="SAE folders with a features.jsonl")
    args = parser.parse_args()
    settings = get_settings()
    engine = load_engine(resolve(BUNDLED_ID, settings), settings)
    assert isinstance(engine, TransformersEngine)
    for folder in args.folders:
        loaded = load_sae(folder)
        assert loaded.layer_hint is not None, f"{folder}: no layer in its config"
        before = (folder / FEATURES_FILE).stat().st_size
        began = time.monotonic()
        path = add_tokens_to_file(folder, engine.model, engine.tokenizer, loaded.sae, loaded.layer_hint)
        print(f"{folder.name}: {time.monotonic() - began:.1f} s; {path.name} {before:,} -> "
              f"{path.stat().st_size:,} bytes", flush=True)


if __name__ == "__main__":
    main()
