"""What tests share, and nothing else: no test lives here.

- ``fakes``: ``FakeEngine``, the scripted engine behind the engine interface (the fast tier runs on it).
- ``helpers``: events, texts and finishes of a generation on a real engine.
- ``saes``: random SAEs written in each published format.
- ``live``, ``waiting``: a live server on a loopback port, and bounded waits on it.
- ``hostile``, ``fuzzing``: request shapes built to crash a checker, and the schemathesis driver.
"""
