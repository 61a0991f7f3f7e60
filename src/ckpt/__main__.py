"""``python -m ckpt``: the command line."""

from ckpt.cli import main

raise SystemExit(main())
