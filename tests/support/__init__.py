"""What tests share, and nothing else: no test lives here, and no test module imports another.

- ``fakes``: ``FakeEngine``, the scripted engine behind the engine interface (the fast tier runs on it); it can
  steer and read (``steerable=True``) and records what it was asked.
- ``cli``: the ``millm`` CLI on the scripted engine (``cli.common.ENGINE_FACTORY``; ``python -m tests.support.cli``).
- ``app``: the real app on the scripted engine through Quart's test client (``make``, ``run``, ``chat``).
- ``lab``: an app with a scripted registry, loader and preflight check (model swaps and unloads).
- ``scheduler``: driving the decode scheduler by hand (``plan``, ``alone``, ``submit``, ``drain``).
- ``helpers``: events, texts and finishes of a generation on a real engine.
- ``saes``: random SAEs written in each published format.
- ``batch_rows``, ``cards``, ``documents``: a batch input, feature-card rows and steering documents.
- ``live``, ``waiting``: a live server on a loopback port, and bounded waits on it.
- ``hostile``, ``fuzzing``: request shapes built to crash a checker, and the schemathesis driver.
- ``collection``: the plugin tests/test_collection.py collects with, reporting what collection imported.

Every module here, like every test module and conftest, imports without torch: torch and what pulls it
(the server app, the engines, steering, SAEs) are imported inside the functions that use them, so
``pytest -m "not model" --collect-only`` never loads it (tests/test_collection.py).
"""
