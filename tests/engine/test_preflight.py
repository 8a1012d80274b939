"""The pre-load check: weights priced in the loader's own dtype, memory freed by an unload counted per
card, malformed model files refused as the client's problem before anything is unloaded, and a swap
reading only the target's header (fast tier: headers and scripted memory figures, no weights)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from millm.config import Settings
from millm.engine import dtypes, preflight
from millm.errors import InsufficientMemory, InvalidModelFiles
from millm.registry import ModelEntry, bundled_gguf, gguf_entry

GIB = preflight.GIB


def checkpoint(folder: Path, params: int, config: object | None = None, header: bytes | None = None) -> ModelEntry:
    """A checkpoint with only a config and a safetensors header describing ``params`` bf16 parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config if config is not None else {}))
    if header is None:
        header = json.dumps({"w": {"dtype": "BF16", "shape": [params], "data_offsets": [0, 2 * params]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    return ModelEntry(id=folder.name, engine="transformers", source="path", path=folder)


def on_cards(monkeypatch, free: dict[str, int], device: str = "cuda") -> None:
    """Pretend this machine has these cards (free bytes each) and torch picks ``device`` for auto."""
    monkeypatch.setattr(preflight, "free_memory", lambda _device: dict(free))
    monkeypatch.setattr(dtypes, "load_device", lambda setting: device if setting == "auto" else setting)
    import millm.engine.manager as manager

    monkeypatch.setattr(manager, "load_device", dtypes.load_device)


def test_auto_dtype_is_one_rule_for_the_loader_and_the_check():
    import torch

    from millm.engine.loader import pick_dtype

    assert dtypes.load_dtype("auto", "cuda") == "bfloat16" and dtypes.load_dtype("auto", "cuda:1") == "bfloat16"
    assert dtypes.load_dtype("auto", "cpu") == "float32" and dtypes.load_dtype("float16", "cpu") == "float16"
    assert pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert dtypes.dtype_bytes(dtypes.load_dtype("auto", "cuda")) == 2


def test_auto_on_cuda_prices_weights_at_two_bytes(tmp_path, monkeypatch):
    """A bf16 checkpoint that fits a card at 2 bytes a parameter (the loader's auto on CUDA) is not refused
    as if it were loaded at 4 (the 55.9 GiB checkpoint refused on a 100 GiB card, scaled down)."""
    from millm.engine.manager import default_preflight

    entry = checkpoint(tmp_path / "big", params=GIB)  # 2 GiB in bf16, 4 GiB in fp32
    on_cards(monkeypatch, {"cuda:0": 3 * GIB})
    default_preflight(entry, None, Settings(home=tmp_path))  # dtype auto: fits
    with pytest.raises(InsufficientMemory):
        default_preflight(entry, None, Settings(home=tmp_path, dtype="float32"))


def test_memory_an_unload_frees_counts_on_its_own_card_only(tmp_path):
    """The model being unloaded lives on cuda:0: what it frees is room on cuda:0 only. Counted on every
    card, 2 GiB freed made 8 GiB of room out of 6, and a 7 GiB load passed the check, then failed after
    the unload."""
    target = ModelEntry(id="t", engine="transformers", source="path", path=tmp_path)
    need = preflight.Footprint(weights=7 * GIB, kv=0)
    free = {"cuda:0": 1 * GIB, "cuda:1": 3 * GIB}
    with pytest.raises(InsufficientMemory) as info:
        preflight.check_memory(target, need, free, {"cuda:0": 2 * GIB})
    assert "cuda:0: 3.00 GiB free" in info.value.message and "cuda:1: 3.00 GiB free" in info.value.message
    preflight.check_memory(target, preflight.Footprint(3 * GIB, 0), free, {"cuda:0": 2 * GIB})  # cuda:0 holds it
    preflight.check_memory(target, preflight.Footprint(6 * GIB, 0), free, {"cuda:0": 2 * GIB})  # split holds it
    preflight.check_memory(target, preflight.Footprint(5 * GIB, 0), {"cpu": 3 * GIB}, {"cpu": 2 * GIB})


def test_an_unmeasured_current_model_on_several_cards_counts_toward_a_split_only(tmp_path, monkeypatch):
    from millm.engine.manager import default_preflight

    current = checkpoint(tmp_path / "cur", params=GIB // 2)  # 1 GiB in bf16
    on_cards(monkeypatch, {"cuda:0": 2 * GIB, "cuda:1": GIB // 4})
    settings = Settings(home=tmp_path)
    large = checkpoint(tmp_path / "large", params=7 * GIB // 4)  # 3.5 GiB
    with pytest.raises(InsufficientMemory):  # counted on every card it made 3 + 1.25 GiB of room
        default_preflight(large, current, settings, freed={"cuda:1": GIB})
    three = checkpoint(tmp_path / "three", params=3 * GIB // 2)  # 3 GiB
    default_preflight(three, current, settings)  # cards unknown: 2 + 0.25 + 1 across both holds it
    default_preflight(three, current, settings, freed={"cuda:0": GIB})  # cuda:0 alone holds it


def test_the_manager_counts_a_torch_models_own_tensors_per_device(tmp_path):
    import torch

    from millm.engine.manager import ModelManager
    from millm.engine.worker import EngineWorker
    from tests.support.fakes import FakeEngine

    engine = FakeEngine()
    engine.model = torch.nn.Linear(16, 16)  # type: ignore[attr-defined]
    manager = ModelManager(Settings(home=tmp_path), EngineWorker(1), engine)
    assert manager.resident() == {"cpu": (16 * 16 + 16) * 4}
    assert ModelManager(Settings(home=tmp_path), EngineWorker(1), FakeEngine()).resident() is None
    assert ModelManager(Settings(home=tmp_path), EngineWorker(1)).resident() == {}
    assert preflight.used_between({"cuda:0": 10, "cuda:1": 5}, {"cuda:0": 4, "cuda:1": 6}) == {"cuda:0": 6, "cuda:1": 0}


@pytest.mark.parametrize("config,header,names", [
    ("{not json", None, "config.json"),
    ("[1, 2]", None, "config.json"),
    ('{"num_hidden_layers": "many"}', None, "num_hidden_layers"),
    ('{"quantization_config": 4}', None, "quantization_config"),
    ("{}", b"\xff\xfe not json", "model.safetensors"),
    ("{}", b'{"w": {"dtype": "F16", "shape": "big"}}', "model.safetensors"),
    ("{}", b"[]", "model.safetensors"),
])
def test_malformed_checkpoint_files_are_the_clients_problem(tmp_path, config, header, names):
    entry = checkpoint(tmp_path / "bad", params=4, header=header)
    (entry.path / "config.json").write_text(config)
    with pytest.raises(InvalidModelFiles) as info:
        preflight.footprint(entry, 2)
    assert info.value.status == 422 and names in info.value.message and "'bad'" in info.value.message


def test_a_header_length_past_the_file_is_refused(tmp_path):
    entry = checkpoint(tmp_path / "bad", params=4)
    (entry.path / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(InvalidModelFiles, match="header bytes"):
        preflight.footprint(entry, 2)


def test_a_truncated_gguf_is_refused_as_invalid_files(tmp_path):
    file = tmp_path / "broken.Q4_0.gguf"
    file.write_bytes(b"GGUF" + b"\0" * 20)
    entry = gguf_entry(file, "path")
    assert entry is not None
    with pytest.raises(InvalidModelFiles, match="not a readable GGUF"):
        preflight.footprint(entry, 2)


def test_a_swap_reads_only_the_targets_gguf_header(tmp_path, monkeypatch):
    from millm.engine.manager import default_preflight

    gguf = bundled_gguf()
    assert gguf is not None
    current, target = gguf_entry(gguf, "bundled"), gguf_entry(gguf, "bundled")
    assert current is not None and target is not None
    parsed: list[str] = []
    real = preflight._gguf_shape

    def counting(entry: ModelEntry):
        parsed.append(entry.id)
        return real(entry)

    monkeypatch.setattr(preflight, "_gguf_shape", counting)
    monkeypatch.setattr(preflight, "free_memory", lambda _device: {"cpu": 64 * GIB})
    default_preflight(target, current, Settings(home=tmp_path, device="cpu"))
    assert parsed == [target.id]
