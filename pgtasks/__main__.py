"""``python -m pgtasks`` runs the command line."""

from pgtasks.cli import main

main()
