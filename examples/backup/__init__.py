"""The backup example: nightly backups per agent host with retries, manual runs and a verify step.

Run it with ``python -m examples.backup`` (see `examples.backup.run`).
"""
