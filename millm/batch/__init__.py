"""``millm batch``: OpenAI batch files answered by the server's own builder and renderers, resumable,
on one process or over a Ray cluster."""
