"""The pure core of ckpt: entries, the entry-name wire format, ordering, overlap, the prune plan, the
framework rules, the ports and the errors.

Nothing in this package performs I/O or imports ``os``, ``pathlib``, ``boto3`` or ``hvac``; a test walks its
imports to keep it that way. Adapters, the watcher and the CLI depend on it, never the reverse.
"""
