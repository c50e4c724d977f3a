"""One module per benchmarked system, ``<name>_system.py``, plus worker-side app modules.

Each ``<name>_system.py`` defines ``SYSTEM`` (a :class:`~benchmarks.systems.base.SystemSpec`)
and ``DRIVER`` (a :class:`~benchmarks.systems.base.Driver` subclass), imports nothing
but the standard library at module level, and ends with
``if __name__ == "__main__": main(DRIVER)``.
"""
