"""Text to train SAEs on, with no network: the user's files, or a default built on the machine.

The default corpus has two parts, both deterministic:

- everyday text the model writes itself: it answers chat prompts built from ~170 everyday topics
  (weather, food, animals, sport, music, places, feelings ...) in 10 kinds of writing (story,
  explanation, news report, description, letter, facts, poem, dialogue, diary, opinion); 256 documents
  by default (one or two per topic, at most 96 new tokens each). Each document is the whole rendered
  conversation (template, prompt, answer): what a chat user later steers. Each answer is a seeded chat
  request on the engine's request path (``Answerer``); the text is cached under MILLM_HOME, batch by batch,
  so an interrupted generation resumes. It is the
  only source of concept text on a fresh install, and the costly part (measured here: 256 documents,
  35k tokens with their templates, took 22 minutes on 2 CPU cores shared with other work);
- Python's own documentation, installed with every Python: the language reference topics
  (``pydoc_data``) and the standard library's docstrings that read as prose (1216 documents, 303k tokens
  with Python 3.11; free).
  Technical, but varied English that fills the token budget.

``--corpus PATH`` takes ``.txt``/``.md`` files (documents separated by blank lines) and ``.jsonl``
files (one object per line with a ``text`` field, or a bare JSON string), or folders of them.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from millm.paths import user_path

TOPICS = (
    "rain", "snow", "thunderstorms", "a sunny summer day", "the weather forecast", "hurricanes", "fog",
    "autumn leaves", "winter", "spring flowers", "cooking pasta", "baking bread", "chocolate cake", "pizza",
    "coffee", "tea", "soup", "fresh fruit", "vegetables from the garden", "a restaurant dinner", "breakfast",
    "spicy food", "cheese", "ice cream", "cats", "dogs", "horses", "birds", "owls", "whales", "sharks",
    "dolphins", "bees", "spiders", "butterflies", "elephants", "lions", "dinosaurs", "a farm", "fishing",
    "the ocean", "a beach holiday", "mountains", "a forest walk", "rivers", "deserts", "volcanoes",
    "earthquakes", "islands", "the jungle", "outer space", "the moon", "Mars", "stars and galaxies",
    "astronauts", "rockets", "black holes", "football", "basketball", "tennis", "swimming", "running a marathon",
    "cycling", "the Olympic Games", "chess", "yoga", "skiing", "music", "playing the guitar", "the piano",
    "a rock concert", "jazz", "singing", "painting", "photography", "sculpture", "dancing", "theatre",
    "movies", "television", "video games", "books", "a library", "poetry", "writing a novel", "newspapers",
    "trains", "cars", "airplanes", "ships", "bicycles", "traffic", "a road trip", "airports", "computers",
    "the internet", "smartphones", "programming", "robots", "artificial intelligence", "electricity",
    "solar power", "batteries", "mathematics", "physics", "chemistry", "biology", "medicine", "hospitals",
    "doctors", "a cold and fever", "sleep", "dreams", "exercise", "healthy eating", "school", "exams",
    "university", "teachers", "homework", "money", "banks", "shopping", "a job interview", "an office",
    "a small business", "taxes", "the stock market", "houses", "gardening", "trees", "furniture",
    "cleaning the house", "a birthday party", "a wedding", "Christmas", "Halloween", "New Year",
    "holidays abroad", "Paris", "Japan", "New York", "ancient Rome", "ancient Egypt", "the Middle Ages",
    "kings and queens", "castles", "knights", "pirates", "war", "peace", "elections", "the law",
    "a court trial", "police detectives", "a mystery", "ghosts", "dragons", "magic", "fairy tales",
    "friendship", "love", "family", "grandparents", "babies", "sadness", "anger", "fear", "happiness",
    "loneliness", "kindness", "climate change", "recycling", "fire", "ice", "gold and jewels", "clothes and fashion",
)

GENRES = (
    "Write a short story about {topic}.",
    "Explain {topic} to a curious child.",
    "Write a short news report about {topic}.",
    "Describe {topic} in vivid detail.",
    "Write a letter to a friend about {topic}.",
    "Give me some interesting facts about {topic}.",
    "Write a poem about {topic}.",
    "Write a dialogue between two people talking about {topic}.",
    "Write a diary entry about a day involving {topic}.",
    "What do you think about {topic}? Give your opinion.",
)

# the sampling of the generated documents (millm.research.answers.SAMPLING); the version names the sampler: the
# engine's (each prompt seeded alone), whose documents are not the earlier private sampler's
GENERATION = {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.15, "sampler": "engine-1"}


def corpus_prompts(seed: int, per_topic: int = len(GENRES)) -> list[str]:
    """``per_topic`` prompts for every topic (genres drawn by ``seed``), in an order shuffled by ``seed``."""
    rng = random.Random(seed)
    pairs = [(topic, genre) for topic in TOPICS for genre in rng.sample(GENRES, min(per_topic, len(GENRES)))]
    rng.shuffle(pairs)
    return [genre.format(topic=topic) for topic, genre in pairs]


def _chat_text(tokenizer: Any, prompt: str, answer: str | None = None) -> str:
    messages = [{"role": "user", "content": prompt}]
    if answer is None:
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    messages.append({"role": "assistant", "content": answer})
    return str(tokenizer.apply_chat_template(messages, tokenize=False))


Answerer = Callable[[list[str], int, int], list[str]]
"""Answers to chat prompts, one each: ``(prompts, seed, max_new_tokens)``, sampled on the engine's request path
with ``GENERATION`` (``millm.research.answers`` makes one from an engine)."""


def _prompts_for(documents: int, seed: int) -> tuple[list[str], int]:
    """The first ``documents`` prompts for ``seed``, and how many each topic gets a round: a round covers every
    topic in every genre; one round is cut to ``documents`` spread over the topics."""
    rounds = -(-documents // (len(TOPICS) * len(GENRES)))
    per_topic = -(-documents // len(TOPICS)) if rounds == 1 else len(GENRES)
    prompts = [p for r in range(rounds) for p in corpus_prompts(seed + r, per_topic)]
    return prompts[:documents], per_topic


def _cached_documents(path: Path, documents: int, batch_size: int) -> list[str]:
    """The documents ``path`` caches; while fewer than ``documents``, whole batches only (a batch the last run
    stopped inside is generated again from its start, with its own seed)."""
    done = [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.is_file() else []
    return done[:len(done) - len(done) % batch_size] if len(done) < documents else done


def generated_corpus(answer: Answerer, tokenizer: Any, cache_dir: Path, model_id: str, *, documents: int, seed: int,
                     max_new_tokens: int = 96, batch_size: int = 64,
                     on_batch: Callable[[int, int], None] | None = None) -> list[str]:
    """``documents`` generated documents for ``seed`` (cached; generation resumes from the cache): each prompt
    answered by ``answer`` and rendered with its answer as one conversation."""
    prompts, per_topic = _prompts_for(documents, seed)
    settings = [model_id, seed, per_topic, max_new_tokens, batch_size, GENERATION]
    key = hashlib.sha256(json.dumps(settings).encode()).hexdigest()
    path = cache_dir / "sae-corpus" / f"{model_id.replace('/', '--')}-{key[:12]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _cached_documents(path, documents, batch_size)
    if len(done) < documents:
        with path.open("w") as f:
            for text in done:
                f.write(json.dumps({"text": text}) + "\n")
            while len(done) < documents:
                index = len(done) // batch_size
                chunk = prompts[len(done):len(done) + batch_size]
                answers = answer(chunk, seed * 100_003 + index * batch_size, max_new_tokens)
                for text in (_chat_text(tokenizer, p, a) for p, a in zip(chunk, answers)):
                    f.write(json.dumps({"text": text}) + "\n")
                    done.append(text)
                f.flush()
                if on_batch is not None:
                    on_batch(min(len(done), documents), documents)
    return done[:documents]


_SKIPPED_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages", "__pycache__"}


def _is_prose(text: str | None, min_chars: int) -> bool:
    """Whether a docstring reads as prose: at least ``min_chars``, >= 90% letters and spaces, no ``>>>``
    examples."""
    if not text or len(text) < min_chars or ">>>" in text:
        return False
    return sum(c.isalpha() or c.isspace() for c in text) >= 0.9 * len(text)


def _docstrings(path: Path, min_chars: int) -> list[str]:
    """The prose docstrings (``_is_prose``) of the module at ``path``, its classes and functions; none when it
    does not parse."""
    import ast

    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError):
        return []
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    texts = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, documented))
    return [text for text in texts if text is not None and _is_prose(text, min_chars)]


def python_documentation(min_chars: int = 300) -> list[str]:
    """Prose from the running Python's documentation: reference topics, then stdlib docstrings of at
    least ``min_chars`` that are >= 90% letters and spaces and hold no interactive examples."""
    import sysconfig
    from pydoc_data.topics import topics

    docs = [topics[name] for name in sorted(topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for p in stdlib.rglob("*.py") if not _SKIPPED_PARTS & set(p.relative_to(stdlib).parts)):
        docs += _docstrings(path, min_chars)
    return docs


def _text_documents(text: str) -> list[str]:
    return [block.strip() for block in text.split("\n\n") if block.strip()]


def _jsonl_documents(path: Path) -> list[str]:
    docs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg}).") from None
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise ValueError(f"{path}:{number}: expected a string or an object with a 'text' string.")
        docs.append(text)
    return docs


def read_corpus(paths: Iterable[Path]) -> list[str]:
    """Documents from text/markdown/jsonl files, or folders of them (read in sorted order)."""
    docs: list[str] = []
    for path in paths:
        path = user_path(path)
        if not path.exists():
            raise ValueError(f"--corpus {path}: no such file or folder.")
        files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".md", ".jsonl")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"--corpus {path}: no .txt, .md or .jsonl files in it.")
        for f in files:
            docs += _jsonl_documents(f) if f.suffix == ".jsonl" else _text_documents(f.read_text(errors="replace"))
    if not docs:
        raise ValueError("The corpus holds no text.")
    return docs


def split_documents(docs: list[str], holdout_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(training, held-out) documents: a seeded shuffle, the last ``holdout_fraction`` held out."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    cut = len(docs) - max(1, round(len(docs) * holdout_fraction)) if holdout_fraction > 0 else len(docs)
    return [docs[i] for i in order[:cut]], [docs[i] for i in order[cut:]]


def token_windows(tokenizer: Any, docs: list[str], context: int, max_windows: int | None = None) -> torch.Tensor:
    """Documents tokenised, joined by EOS and cut into ``[n, context]`` windows (the tail is dropped)."""
    sep = tokenizer.eos_token_id
    stream: list[int] = []
    limit = None if max_windows is None else max_windows * context
    for doc in docs:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"]
        if sep is not None:
            stream.append(sep)
        if limit is not None and len(stream) >= limit:
            break
    n = len(stream) // context if limit is None else min(len(stream) // context, max_windows or 0)
    if n == 0:
        raise ValueError(f"The corpus has {len(stream)} tokens, fewer than one window of {context}.")
    return torch.tensor(stream[:n * context]).view(n, context)
