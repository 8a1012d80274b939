"""Teacher-forced passes that run the tokens their rows share once (``millm.engine.shared_prefix``): which rows
share a batch, and, on the bundled model, that echo scoring gives what each row scored alone gives."""

from __future__ import annotations

import pytest

from millm.engine.params import ChatPrompt, TextPrompt


def test_common_prefix():
    from millm.engine.shared_prefix import common_prefix

    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix([[1, 2], [3]]) == 0
    assert common_prefix([[5, 6]]) == 2 and common_prefix([]) == 0


def test_rows_with_one_prompt_get_batches_of_their_own_and_the_rest_fill_batches():
    from millm.engine.shared_prefix import SHARED_ROWS, batches

    prompt_a, prompt_b = [1, 2, 3], [1, 2, 4]
    rows = ([prompt_b + [9, k] for k in range(SHARED_ROWS)] + [prompt_a + [7]]
            + [prompt_a + [8, k] for k in range(SHARED_ROWS + 2)] + [[5, 5, 5, 1], [5, 5, 6, 2]])
    heads = [3] * len(rows)
    got = batches(rows, heads, size=SHARED_ROWS + 1)
    assert sorted(i for batch in got for i in batch) == list(range(len(rows)))  # every row once
    assert all(len(batch) <= SHARED_ROWS + 1 for batch in got)
    with_a = [b for b in got if all(rows[i][:3] == prompt_a for i in b)]
    with_b = [b for b in got if all(rows[i][:3] == prompt_b for i in b)]
    assert sum(map(len, with_a)) == SHARED_ROWS + 3 and sum(map(len, with_b)) == SHARED_ROWS
    assert any(len({tuple(rows[i][:3]) for i in b}) == 2 for b in got)  # the two loose rows share a batch


@pytest.mark.model
def test_echo_scoring_with_a_shared_prompt_equals_each_row_alone(engine):
    """Six answers to one prompt and two to others, scored from their answers on (a research measure's rows):
    every token's log-probability is what scoring that row by itself gives."""
    from millm.engine.params import TokenPrompt
    from millm.engine.scoring import ScoreRequest, ScoreRow, ScoringParams

    echo = ScoringParams(allowed=None, temperature=0.0, top_n=0, report=True, echo=True, next_token=False)
    answers = ["Rain fell all night.", "The dog barked twice at the door.", "I like trains.", "Cities are big.",
               "A garden needs water and sun to grow.", "Books hold stories."]
    rows = []
    for prompt, some in (("Tell me about your day.", answers), ("What is a cloud?", answers[:1]),
                         ("", answers[1:2])):
        head = engine.tokenize(ChatPrompt([{"role": "user", "content": prompt}]))
        for answer in some:
            ids = head + engine.tokenize(TextPrompt(answer, add_special_tokens=False))
            rows.append(ScoreRow(TokenPrompt(tuple(ids), "p"), echo, echo_from=len(head)))
    together = engine.score(ScoreRequest(rows, batch_size=4))
    for row, got in zip(rows, together):
        [alone] = engine.score(ScoreRequest([row]))
        assert got.prompt_ids == alone.prompt_ids
        pairs = [(a.logprob, b.logprob) for a, b in zip(got.echo, alone.echo)]
        assert all((a is None) == (b is None) for a, b in pairs) and any(a is not None for a, _ in pairs)
        assert max(abs(a - b) for a, b in pairs if a is not None and b is not None) < 1e-3


@pytest.mark.model
def test_a_sliding_window_model_scores_rows_as_each_alone(engine):
    """Sliding-window layers mask by cache slot, so rows of such a model do not share a prompt's keys and
    values (the padding after the shared part would read as distance): each row's echo is its own."""
    from millm.engine.params import TokenPrompt
    from millm.engine.scoring import ScoreRequest, ScoreRow, ScoringParams
    from tests.support.tiny import tiny_engine

    tiny = tiny_engine(engine, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    echo = ScoringParams(allowed=None, temperature=0.0, top_n=0, report=True, echo=True, next_token=False)
    head = tiny.tokenize(ChatPrompt([{"role": "user", "content": "Tell me about your day."}]))
    rows = [ScoreRow(TokenPrompt(tuple(head + tiny.tokenize(TextPrompt(a, add_special_tokens=False))), "p"), echo,
                     echo_from=len(head))
            for a in ("Rain fell all night long on the roof.", "Dogs.", "I like trains a lot.", "Cities.")]
    for row, got in zip(rows, tiny.score(ScoreRequest(rows, batch_size=4))):
        [alone] = tiny.score(ScoreRequest([row]))
        pairs = [(a.logprob, b.logprob) for a, b in zip(got.echo, alone.echo) if a.logprob is not None]
        assert pairs and max(abs(a - b) for a, b in pairs) < 1e-3
