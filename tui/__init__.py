"""``millm tui``: live steering in the terminal (Textual), its strength slider and intensity dial, in-process or on a
server's URL."""
