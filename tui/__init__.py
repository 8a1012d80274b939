"""``millm tui``: the live steering dial in the terminal (Textual), in-process or on a server's URL."""
