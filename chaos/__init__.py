"""The chaos harness: pgtasks' guarantees checked under injected faults.

``python -m chaos --seed N --duration S [--pooler]`` starts a private PostgreSQL primary
and its synchronous standby (with ``--pooler``, a PgBouncer in front), a supervised
fleet of ``pgtasks worker`` and ``pgtasks scheduler`` processes on the app of
`chaos.app`, feeds them a seeded stream of jobs and a cron schedule, and injects a
seeded plan of faults: processes killed, drained, stopped past their lease, database
connections terminated, the primary restarted or failed over to the standby. Then it
checks the invariants of `chaos.invariants` from the database and the tasks' side
ledger, prints a table and exits non-zero on a violation. See docs/chaos.md.
"""
