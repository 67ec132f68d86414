"""The ``bertrace`` command line: commands that are no DVC stage (``main.py`` dispatches them)."""
