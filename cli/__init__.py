"""The ``millm`` command line."""
