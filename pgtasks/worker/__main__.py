"""``python -m pgtasks.worker --spec-fd N``: the image a ``pgtasks worker`` process re-executes into."""

from pgtasks.worker.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
