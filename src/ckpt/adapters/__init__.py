"""Adapters carry the domain's ports out on real technology: ``posix``, ``s3``, ``proxy``.

Each module imports its vendor library lazily, is handed its client by injection, and translates every vendor
exception into ``ckpt.domain.errors`` at its boundary.
"""
