"""The transformers engine on the real bundled model."""

import time

import pytest

from millm.engine.params import ChatPrompt, GenerationRequest, TextPrompt
from millm.engine.templates import render_chat
from millm.errors import ContextLengthExceeded, InvalidParameter
from millm.requests.validation import sampling_params
from tests.support.helpers import events, finishes, texts, usage


def test_greedy_capital_of_france(engine):
    evts = events(engine, "What is the capital of France?", temperature=0, max_tokens=24)
    assert "Paris" in texts(evts)[0]
    u = usage(evts)
    assert u.completion_tokens <= 24 and u.prompt_tokens > 5


def test_seeded_sampling_is_reproducible_and_seeds_differ(engine):
    fields = dict(temperature=1.2, max_tokens=16)
    a = events(engine, "Write a word.", seed=11, **fields)
    b = events(engine, "Write a word.", seed=11, **fields)
    assert texts(a) == texts(b) and finishes(a) == finishes(b)
    others = {texts(events(engine, "Write a word.", seed=s, **fields))[0] for s in (1, 2, 3)}
    assert len(others | {texts(a)[0]}) > 1


def test_max_tokens_gives_length(engine):
    evts = events(engine, "Count from one to one hundred in words.", temperature=0, max_tokens=5)
    assert finishes(evts) == {0: "length"}
    assert usage(evts).completion_tokens == 5


def test_eos_gives_stop(engine):
    evts = events(engine, "Say just 'hi'.", temperature=0, max_tokens=64)
    assert finishes(evts) == {0: "stop"}
    assert "<|im_end|>" not in texts(evts)[0]


def test_stop_string_spanning_tokens_is_cut_and_never_streamed(engine):
    prompt = "What is the capital of France?"
    full = texts(events(engine, prompt, temperature=0, max_tokens=24))[0]
    i = full.index("Paris")
    stop = full[i + 1:i + 4]  # "ari": inside a token boundary region of " Paris"
    ids = engine.tokenizer(full[:i + 6], add_special_tokens=False)["input_ids"]
    evts = events(engine, prompt, temperature=0, max_tokens=24, stop=[stop])
    streamed = [e.text for e in evts if hasattr(e, "text")]
    assert "".join(streamed) == full[:i + 1]
    assert all(stop not in s and not s.endswith(stop[:1] + stop[1:2]) for s in streamed)
    assert finishes(evts) == {0: "stop"}
    # a stop that only exists across two tokens
    two_token = full[:i + 6]
    pieces = [engine.tokenizer.decode([t]) for t in ids]
    joined = next(a[-2:] + b[:2] for a, b in zip(pieces, pieces[1:]) if len(a) >= 2 and len(b) >= 2)
    evts = events(engine, prompt, temperature=0, max_tokens=24, stop=joined)
    got = texts(evts).get(0, "")
    assert joined not in got and got == two_token[:two_token.index(joined)]


def test_streamed_utf8_equals_full_decode(engine):
    import torch

    prompt = [{"role": "user", "content": "Repeat exactly: 你好，世界 😀🎉 café"},
              {"role": "assistant", "content": "你好，世界 😀🎉"}]
    evts = events(engine, prompt, temperature=0, max_tokens=12)
    pieces = [e.text for e in evts if hasattr(e, "text")]
    assert all("\ufffd" not in p for p in pieces)
    # recompute the ids greedily and compare with decode(all)
    ids = engine.tokenize(ChatPrompt(prompt))
    out = []
    with torch.inference_mode():
        for _ in range(usage(evts).completion_tokens):
            nxt = int(engine.model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in engine.stop_ids:
                break
    assert "".join(pieces) == engine.tokenizer.decode(out, skip_special_tokens=True)


def test_multibyte_tokens_in_sampled_text(engine):
    evts = events(engine, "Write three emoji and three Chinese characters.", temperature=1.0, seed=3, max_tokens=40)
    assert all("\ufffd" not in e.text for e in evts if hasattr(e, "text"))


def test_context_length_error_carries_both_numbers(engine):
    with pytest.raises(ContextLengthExceeded) as exc:
        engine.prepare(GenerationRequest([ChatPrompt([{"role": "user", "content": "hi"}])],
                                         sampling_params({"max_tokens": engine.context_window})))
    assert exc.value.available == engine.context_window
    assert exc.value.requested > engine.context_window
    assert str(engine.context_window) in exc.value.message and exc.value.status == 400
    long_prompt = TextPrompt("word " * (engine.context_window + 10))
    with pytest.raises(ContextLengthExceeded):
        engine.prepare(GenerationRequest([long_prompt]))


def test_n_choices(engine):
    evts = events(engine, "Name a colour.", temperature=1.0, seed=5, n=3, max_tokens=8)
    assert set(texts(evts)) == {0, 1, 2} and set(finishes(evts)) == {0, 1, 2}
    assert len(set(texts(evts).values())) > 1
    greedy = texts(events(engine, "Name a colour.", temperature=0, n=2, max_tokens=8))
    assert greedy[0] == greedy[1]


@pytest.mark.parametrize("penalty,prompt", [("frequency_penalty", "List the word cat ten times:"),
                                            ("presence_penalty", "Say yes five times.")])
def test_penalty_reduces_repeats(engine, penalty, prompt):
    def repeats(**kw):
        out = texts(events(engine, prompt, temperature=0, max_tokens=30, **kw))[0]
        words = out.split()
        return len(words) - len(set(words))

    assert repeats(**{penalty: 2.0}) < repeats()


def test_trailing_assistant_message_is_continued(engine):
    convo = [{"role": "user", "content": "Write a sentence about the sea."},
             {"role": "assistant", "content": "The sea is"}]
    rendered = render_chat(engine.tokenizer, convo)
    assert rendered.endswith("<|im_start|>assistant\nThe sea is")
    assert not rendered.endswith("<|im_end|>\n")
    closed = render_chat(engine.tokenizer, convo + [{"role": "user", "content": "x"}])
    assert "The sea is<|im_end|>" in closed
    out = texts(events(engine, convo, temperature=0, max_tokens=10))[0]
    assert not out.lstrip().startswith("The sea is")


def test_roles_and_text_parts_render(engine):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "tool", "content": "result: ok"},
            {"role": "user", "content": "Thanks"}]
    text = render_chat(engine.tokenizer, msgs)
    assert "result: ok" in text and text.endswith("<|im_start|>assistant\n")


def test_text_prompt_is_verbatim(engine):
    ids = engine.tokenize(TextPrompt("Hello there"))
    assert engine.tokenizer.decode(ids) == "Hello there"


def test_empty_text_prompt_refused(engine):
    with pytest.raises(InvalidParameter):
        engine.prepare(GenerationRequest([TextPrompt("")]))


def test_embeddings_deterministic_and_shaped(engine):
    import torch

    a, tokens = engine.embed(["The cat sat.", "A longer sentence about dogs and parks."])
    b, _ = engine.embed(["The cat sat."])
    assert len(a) == 2 and len(a[0]) == engine.model.config.hidden_size
    assert tokens > 5
    assert torch.allclose(torch.tensor(a[0]), torch.tensor(b[0]), atol=1e-5)  # padding does not leak
    assert a[0] != a[1]


def test_embedding_refuses_empty_and_oversized(engine):
    with pytest.raises(InvalidParameter, match=r"input\[1\]"):
        engine.embed(["ok", ""])
    with pytest.raises(ContextLengthExceeded):
        engine.embed(["word " * (engine.context_window + 5)])


TIKTOKEN_IDS = [791, 6864, 315, 9822, 374, 12366, 13, 100257]  # cl100k: "The capital of France is Paris." + eot


def test_embedding_token_ids_past_the_vocabulary_are_named_as_another_tokenizers(engine):
    """LangChain's OpenAIEmbeddings sends tiktoken ids by default: the 400 says so and names the fix (issue 36)."""
    vocab = len(engine.tokenizer)
    for inputs, where in (([TIKTOKEN_IDS], "input"), ([[1, 2], [3, vocab]], "input[1]")):
        with pytest.raises(InvalidParameter) as exc:
            engine.embed(inputs)
        assert exc.value.param == where and exc.value.status == 400
        message = exc.value.message
        assert "another tokenizer" in message and "tiktoken" in message, message
        assert "check_embedding_ctx_length=False" in message and f"0-{vocab - 1}" in message, message
    with pytest.raises(InvalidParameter, match="outside this model's vocabulary") as exc:
        engine.embed([[1, -1]])
    assert "tiktoken" not in exc.value.message  # a negative id is no other tokenizer's
    vectors, tokens = engine.embed([[1, 2, vocab - 1]])  # ids inside the vocabulary are this model's
    assert len(vectors) == 1 and tokens == 3


def test_fingerprint_format(engine):
    from types import SimpleNamespace

    from millm.engine.base import fingerprint, numerics

    assert engine.fingerprint == "millm:SmolLM2-135M-Instruct@unrecorded:float32/Q4_1:transformers"
    assert numerics(engine) == "float32"  # what a steering measure on it records
    gguf = SimpleNamespace(fingerprint=fingerprint("org/m:v2", None, None, "Q4_1", "llama.cpp"))
    assert numerics(gguf) == ""  # a GGUF file's numbers are its quantization: no dtype to record


def test_closing_the_stream_cancels_and_releases(engine):
    stream = engine.generate(GenerationRequest([ChatPrompt([{"role": "user", "content": "Tell a story."}])],
                                               sampling_params({"temperature": 0, "max_tokens": 200})))
    next(stream)
    stream.close()
    assert engine._lock.acquire(timeout=1)
    engine._lock.release()


def test_cached_load_is_fast_and_identical(engine, settings):
    import torch

    from millm.engine import load_engine
    from millm.registry import BUNDLED_ID, resolve

    start = time.perf_counter()
    again = load_engine(resolve(BUNDLED_ID, settings), settings)
    assert time.perf_counter() - start < 10
    ids = torch.tensor([engine.tokenize(TextPrompt("Hello world"))])
    with torch.inference_mode():
        assert torch.equal(engine.model(ids).logits, again.model(ids).logits)
