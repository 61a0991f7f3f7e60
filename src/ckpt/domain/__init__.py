"""The pure core of ckpt: entries, the entry-name wire format, ordering, overlap, the prune plan and its
re-check, the prune journal's format, the S3 root grammar, save locations, the framework rules, the ports
and the errors.

Nothing in this package performs I/O or imports ``os``, ``pathlib``, ``boto3`` or ``hvac``; a test walks its
imports to keep it that way. The application layer, the adapters, the watcher and the CLI depend on it, never
the reverse (the import-linter contract in pyproject.toml).
"""
