"""The Textual steering dial (``millm tui``); arrives with the steering work."""
