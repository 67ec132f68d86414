"""``python -m stages.cli``: the ``bertrace`` command."""

from stages.cli.main import main

main()
