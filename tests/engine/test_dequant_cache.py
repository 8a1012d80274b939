"""The dequantised-GGUF cache when two processes build it at once (found running `millm serve` beside another
first load: the second rename failed with 'Directory not empty' and the server died)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class Saver:
    """What _write_dequant_cache reads of a model and a tokenizer."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.config = SimpleNamespace(tie_word_embeddings=False, to_dict=lambda: {"model_type": "llama"})

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {"w": torch.full((2, 2), self.value)}

    def save_pretrained(self, folder: Any) -> None:
        Path(folder, "tokenizer.json").write_text("{}")


def weight(folder: Path) -> float:
    from safetensors.torch import load_file

    return float(load_file(str(folder / "model.safetensors"))["w"][0, 0])


def test_a_cache_another_process_finished_first_is_kept(tmp_path):
    from millm.engine.loader import _cache_is_complete, _write_dequant_cache  # torch: imported when a test runs

    target = tmp_path / "cache" / "model"
    _write_dequant_cache(Saver(1.0), Saver(1.0), target)
    _write_dequant_cache(Saver(2.0), Saver(2.0), target)  # the second process, finishing later
    assert _cache_is_complete(target) and weight(target) == 1.0
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no staging folder left


def test_a_folder_of_another_cache_format_is_replaced(tmp_path):
    from millm.engine.loader import CACHE_FORMAT, _cache_is_complete, _write_dequant_cache

    target = tmp_path / "cache" / "model"
    target.mkdir(parents=True)
    (target / "millm-cache.json").write_text(json.dumps({"format": CACHE_FORMAT + 1}))
    (target / "stale").write_text("x")
    _write_dequant_cache(Saver(3.0), Saver(3.0), target)
    assert _cache_is_complete(target) and weight(target) == 3.0 and not (target / "stale").exists()
