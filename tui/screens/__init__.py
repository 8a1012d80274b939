"""The TUI's screens: the main steering screen and its dialogs."""
