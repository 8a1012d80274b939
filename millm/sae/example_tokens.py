"""Per-token values of a feature card's examples: each token of an example excerpt with the feature's activation
there, so a feature page can shade every token, not only the one that fired.

An example's ``text`` is the excerpt the labeller kept (a dozen tokens before the firing token, between « and »,
and a few after). Its ``tokens`` are that excerpt (marks removed) read on its own: tokenised, after one throwaway
first position (the attention sink the SAE was never trained on, as ``millm.sae.training`` skips it), through the
model to the SAE's layer (resid_post) and encoded; each piece is the excerpt's own characters, so the pieces
joined are the excerpt. The labeller read the firing token inside its whole window, so its recorded
``activation`` may differ from the value read on the excerpt alone; both are shown as what they are.

``millm sae train`` writes them as it labels; ``add_tokens`` adds them to an SAE's existing ``features.jsonl``
(``bench/card_tokens.py``, how the bundled SAEs' cards got theirs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from millm.sae.activations import resid_post
from millm.sae.cards import FEATURES_FILE, example_parts

BATCH = 64  # excerpts read per forward
DIGITS = 3  # decimals a value is stored with


def pieces(tokenizer: Any, text: str) -> tuple[list[int], list[str]]:
    """``text``'s token ids and, per token, the characters it covers (contiguous: the pieces join to ``text``)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, spans = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    out, at = [], 0
    for k in range(len(ids)):
        end = len(text) if k == len(ids) - 1 else max(at, spans[k + 1][0])
        out.append(text[at:end])
        at = end
    return ids, out


@torch.inference_mode()
def read_tokens(model: Any, tokenizer: Any, sae: Any, layer: int, examples: Sequence[tuple[int, str]],
                on_batch: Callable[[int], None] = lambda _: None) -> list[list[list[Any]]]:
    """Per ``(feature, marked text)``: ``[[piece, value], ...]``, the feature's activation at each token of the
    excerpt read on its own (module docstring). ``on_batch(done)`` hears how many are read."""
    sink = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id or 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else sink
    out: list[list[list[Any]]] = []
    for lo in range(0, len(examples), BATCH):
        batch = examples[lo:lo + BATCH]
        read = [pieces(tokenizer, "".join(example_parts(text))) for _, text in batch]
        length = 1 + max((len(ids) for ids, _ in read), default=0)
        ids = torch.full((len(batch), length), pad, dtype=torch.long)
        for row, (tokens, _) in enumerate(read):
            ids[row, 0] = sink
            ids[row, 1:1 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        hidden = resid_post(model, ids, layer)[:, 1:]  # right padding: a causal model's real positions are unchanged
        features = torch.tensor([f for f, _ in batch])
        acts = sae.encode(hidden.reshape(-1, hidden.shape[-1])).reshape(len(batch), length - 1, -1)
        values = acts[torch.arange(len(batch)), :, features]  # [batch, length - 1]
        for row, (_, texts) in enumerate(read):
            out.append([[piece, round(float(v), DIGITS)] for piece, v in zip(texts, values[row].tolist())])
        on_batch(len(out))
    return out


def add_tokens(records: list[dict[str, Any]], model: Any, tokenizer: Any, sae: Any, layer: int,
               on_batch: Callable[[int], None] = lambda _: None) -> None:
    """Every example of ``records`` (``features.jsonl`` rows, or ``FeatureRecord.examples`` as dicts) given its
    ``tokens``, in place."""
    slots = [(row["index"], example) for row in records for example in row.get("examples") or []]
    read = read_tokens(model, tokenizer, sae, layer, [(i, e["text"]) for i, e in slots], on_batch)
    for (_, example), tokens in zip(slots, read, strict=True):
        example["tokens"] = tokens


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def add_tokens_to_file(folder: Path, model: Any, tokenizer: Any, sae: Any, layer: int,
                       on_batch: Callable[[int], None] = lambda _: None) -> Path:
    """The SAE's ``features.jsonl`` in ``folder`` rewritten with every example's ``tokens``. The file is read
    again just before it is written and only the examples' ``tokens`` are set there (by feature and text), so a
    change another writer made meanwhile to any other key (a measured strength) is kept."""
    path = folder / FEATURES_FILE
    read = _rows(path)
    add_tokens(read, model, tokenizer, sae, layer, on_batch)
    tokens = {(row["index"], e["text"]): e["tokens"] for row in read for e in row.get("examples") or []}
    rows = _rows(path)
    for row in rows:
        for example in row.get("examples") or []:
            if (row["index"], example["text"]) in tokens:
                example["tokens"] = tokens[row["index"], example["text"]]
    scratch = path.with_name(path.name + ".tokens")
    scratch.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    scratch.replace(path)  # one atomic replace
    return path
