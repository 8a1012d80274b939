"""The web console's files (package data): ``index.html`` and ``static/`` (plain ES modules and CSS, no build step).

Nothing here runs on the server: :mod:`millm.server.console` serves these files and the page, in the browser,
speaks only the public ``/api`` and ``/v1`` routes, so whatever the console does a script can do.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent
"""Where the console's files lie: ``index.html`` and ``static/``."""
STATIC = ROOT / "static"
