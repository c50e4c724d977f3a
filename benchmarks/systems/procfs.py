"""What ``/proc`` says about a process: its descendants, start time, CPU time and memory.

Linux only (proc(5)); standard library only, like every driver-side module.
"""

from __future__ import annotations

import os


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces: fields resume after its closing parenthesis.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, read from ``/proc``."""
    children = _children_map()
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, []))
    return tree


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (from ``state``), or None.

    Field ``i`` here is field ``i + 3`` of proc(5): the command name, in parentheses,
    may hold spaces, so the split starts after its closing parenthesis.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (None when it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def resident_bytes(pid: int) -> tuple[int, int]:
    """Resident set size of one process and its anonymous part, in bytes ((0, 0) when gone).

    The anonymous part is what the process allocated itself (heap, stacks): RSS less
    the resident pages mapped from files or shared memory (the ``shared`` field of
    ``/proc/PID/statm``, proc(5)). How many of a shared library's pages are resident in
    a process depends on the page cache's history (see
    `benchmarks.systems.memory.evict_shared_objects`); the anonymous part does not.
    """
    try:
        with open(f"/proc/{pid}/statm") as handle:
            fields = handle.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page
    except (OSError, IndexError, ValueError):
        return 0, 0
