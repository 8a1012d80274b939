"""Response rendering shared by every front end: OpenAI bodies, streamed frames and miLLM's headers.

Nothing here imports Quart, Typer or Textual: the server, ``millm batch`` and the TUI render the same
events with the same functions.
"""
