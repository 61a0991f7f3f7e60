"""A complete save holds something: the check every framework rule's verdict passes (spec/watcher.md §2.6).

Some rules decide by what is *absent*: NeMo's ``-unfinished`` marker lies beside the save, a configured rule
may require nothing or only forbid files. Read alone, such a rule finds a save that is not there (deleted by
hand, by the framework's retention) or that holds nothing complete. So a rule's "complete" stands only
when the save holds something.

Rules:

1. A folder save holds at least one regular file, at any depth (empty sub-folders hold nothing); a
   single-file save is at least one byte long.
2. The facts the rule already gathered usually show it (:func:`shows_content`): a file inside the folder
   that exists or was read, a non-empty listing of the folder; a head or tail of the file itself. Only when
   they do not tell is one more fact read (``ckpt.application.inspection``): the folder's listing, or the
   file's first byte. So the rules that look inside the save (``hf``, ``dcp``, ``lightning``, ``deepspeed``,
   ``megatron``, ``orbax``, and configured rules with ``required``, ``json`` or ``zip`` files) cost nothing
   more, and a rule that passes a save it did not look into costs one request more, only when it passes.
3. The check comes after the rule's own verdict, so an incomplete save keeps the rule's reason; a save that
   passes the rule and holds nothing gets :data:`EMPTY_FOLDER`, :data:`EMPTY_FILE` or :data:`MISSING_FILE`.
   A missing folder and an emptied one look the same on S3 (no objects under the prefix): verified resolve
   tells them apart by the parent's listing (``save folder is missing``, watcher.md §6.3).

Pure: attrs and the domain only.
"""

from __future__ import annotations

from ckpt.domain.rules.model import Kind, SaveView

__all__ = ["EMPTY_FILE", "EMPTY_FOLDER", "MISSING_FILE", "absence_reason", "shows_content"]

EMPTY_FOLDER = "save folder holds no files"
EMPTY_FILE = "save file is empty"
MISSING_FILE = "save file is missing"


def shows_content(view: SaveView) -> bool | None:
    """Whether the gathered facts show the save holds something (rule 1): ``None`` when they do not tell.

    >>> from ckpt.domain.rules.model import Save
    >>> save = Save(100, "model-step=100")
    >>> shows_content(SaveView(save, present={"model-step=100-unfinished": False}))  # a sibling says nothing
    >>> shows_content(SaveView(save, files=()))
    False
    >>> shows_content(SaveView(save, present={"model-step=100/weights/.metadata": True}))
    True
    """
    save = view.save
    if save.kind is Kind.FILE:
        head = view.heads.get(save.name)
        tail = view.tails.get(save.name)
        if head is not None or tail is not None:
            return bool(head) or (tail is not None and tail.size > 0)
        if view.present.get(save.name) is False or save.name in view.heads or save.name in view.tails:
            return False  # asked, and the file is not there
        return None
    if view.files is not None:
        return bool(view.files)
    inside = f"{save.name}/"
    seen = [
        *(path for path, present in view.present.items() if present),
        *(path for path, head in view.heads.items() if head is not None),
        *(path for path, tail in view.tails.items() if tail is not None),
    ]
    return True if any(path.startswith(inside) for path in seen) else None


def absence_reason(view: SaveView) -> str | None:
    """Why the save holds nothing, or ``None`` when the view shows it holds something (rules 1, 3).

    Call it once the view tells (:func:`shows_content` is not ``None``); a view that does not tell is
    judged as holding nothing, which is the safe side.
    """
    if shows_content(view):
        return None
    save = view.save
    if save.kind is Kind.FOLDER:
        return EMPTY_FOLDER
    if view.heads.get(save.name) is None and view.tails.get(save.name) is None:
        return MISSING_FILE
    return EMPTY_FILE
