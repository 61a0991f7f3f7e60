"""Publish and resume from inside the training script: Hugging Face, Lightning, PyTorch DCP, Accelerate.

Each framework has its own module, imported only when used (``import ckpt`` and ``import ckpt.integrations``
never import a framework): ``ckpt.integrations.hf``, ``ckpt.integrations.dcp``. What they share is in
``ckpt.integrations.core``: the job's settings, "publish on one rank after a barrier", and
:func:`resume_location`, the one-line resume with catch-up.
"""

from __future__ import annotations

from ckpt.integrations.core import Job, Publisher, open_job, resume_location

__all__ = ["Job", "Publisher", "open_job", "resume_location"]
