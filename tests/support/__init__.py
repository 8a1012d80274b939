"""What tests share, and nothing else: no test lives here, and no test module imports another.

- ``fakes``: ``FakeEngine``, the scripted engine behind the engine interface (the fast tier runs on it).
- ``app``: the real app on the scripted engine through Quart's test client (``make``, ``run``, ``chat``).
- ``lab``: an app with a scripted registry, loader and preflight check (model swaps and unloads).
- ``scheduler``: driving the decode scheduler by hand (``plan``, ``alone``, ``submit``, ``drain``).
- ``helpers``: events, texts and finishes of a generation on a real engine.
- ``saes``: random SAEs written in each published format.
- ``cards``, ``documents``: feature-card rows and steering documents several test packages read.
- ``live``, ``waiting``: a live server on a loopback port, and bounded waits on it.
- ``hostile``, ``fuzzing``: request shapes built to crash a checker, and the schemathesis driver.
"""
