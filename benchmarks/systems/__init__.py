"""One module per benchmarked system, ``<name>_system.py``, plus worker-side app modules.

Each ``<name>_system.py`` defines ``SYSTEM`` (a :class:`~benchmarks.systems.base.SystemSpec`)
and ``DRIVER`` (a :class:`~benchmarks.systems.base.Driver` subclass), imports nothing
but the standard library and the shared modules below at module level, and ends with
``if __name__ == "__main__": main(DRIVER)`` (`benchmarks.systems.entry.main`).

The driver side every system shares, standard library only: `base` (the primitives a
system implements), `records` (the job and the files its task writes), `ops` (the
figures), `drain` and `clock` (their timing), `fleet`, `memory` and `procfs` (the
worker processes and what they use), `entry` (a driver module's command line).
"""
