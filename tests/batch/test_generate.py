"""``millm.batch.generate`` on the real model: rows batched together (a padded plan, the scheduler's batch)
decode exactly as each would alone. (``millm batch`` itself: tests/cli/test_batch.py.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from millm.engine.decode.admission import BatchSettings
from millm.requests.builder import build_chat

if TYPE_CHECKING:
    from millm.batch.generate import Job


def chat_job(engine, text: str, **fields: Any) -> Job:
    from millm.batch.generate import Job

    body = {"model": engine.model_id, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": 4, **fields}
    built = build_chat(body, lambda _: "transformers")
    return Job([engine.prepare(built.generations[0])])


def test_shared_padded_runs_equal_runs_alone(engine):
    """Greedy rows with equal parameters decode as one padded plan (the path of engines without a
    scheduler), and each row's events are those of its own run."""
    from millm.batch.generate import run_generations, run_padded

    texts = ["Hi.", "What is the capital of France?", "Name a fruit."]
    shared, alone = [chat_job(engine, t) for t in texts], [chat_job(engine, t) for t in texts]
    run_padded(engine, shared)
    run_generations(engine, alone, shares=False)
    assert [j.events for j in shared] == [j.events for j in alone]
    assert all(j.error is None and j.events for j in shared)


def test_scheduled_rows_with_different_parameters_equal_runs_alone(engine, settings, monkeypatch):
    """Rows with different budgets, stops and penalties share the scheduler's batch, each giving the events of
    its own run; the scheduler's fallbacks (a seed, n > 1) are the only rows it serves alone: a schema is a
    row's own matcher, batched (MILLM_BATCHING_CONSTRAINTS=refuse would serve it alone)."""
    from millm.batch.generate import run_generations

    def jobs() -> list[Job]:
        return [chat_job(engine, "Hi."), chat_job(engine, "What is the capital of France?", max_tokens=7),
                chat_job(engine, "Count to five.", stop=[","]),
                chat_job(engine, "Name a fruit.", frequency_penalty=1.5),
                chat_job(engine, "Pick a word.", temperature=1, seed=3), chat_job(engine, "Say yes.", n=2),
                chat_job(engine, "JSON.", response_format={"type": "json_object"}, max_tokens=6)]

    from millm.engine.decode.scheduler import Scheduler

    alone = jobs()
    run_generations(engine, alone, shares=False)
    submitted: list[bool] = []
    real_submit = Scheduler.submit

    def counted(self, job):
        submitted.append(job.alone)
        return real_submit(self, job)

    monkeypatch.setattr(Scheduler, "submit", counted)
    batched = jobs()
    run_generations(engine, batched, BatchSettings.of(settings))
    assert [j.events for j in batched] == [j.events for j in alone]
    assert all(j.error is None and j.events for j in batched)
    assert submitted == [False, False, False, False, True, True, False]
