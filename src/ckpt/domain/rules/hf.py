"""The ``hf`` rule (Hugging Face ``Trainer``) in the shape every rule has, over ``ckpt.domain.frameworks``.

The decisions themselves (the ``checkpoint-<step>`` name, ``trainer_state.json``, the sentinel, every
rank's ``rng_state_<i>.pth`` when the world size is above 1, settle) live in ``ckpt.domain.frameworks``,
which this module only adapts to :class:`~ckpt.domain.rules.model.Rule`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ckpt.domain.frameworks import (
    INCOMPLETE_SENTINEL,
    RNG_STATE_MAX_BYTES,
    TRAINER_STATE,
    FileTail,
    Framework,
    Markers,
    check_markers,
    rank_files,
    save_step,
)
from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save
from ckpt.domain.saves import MAX_READ_BYTES

__all__ = ["HfRule"]

_STATE_LIMIT = MAX_READ_BYTES  # the Trainer's log history makes trainer_state.json large (saves.py rule 4)


def hf_step(item: Item) -> int | None:
    """The step of a ``checkpoint-<N>`` folder, else ``None``."""
    return save_step(Framework.HF, item.name) if item.kind is Kind.FOLDER else None


@attrs.frozen
class HfRule:
    """The ``hf`` rule."""

    world_size: int | None = None
    name: str = "hf"
    pattern: str = "checkpoint-<step>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``checkpoint-`` at the largest step."""
        return longest_name("checkpoint-{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``checkpoint-<N>`` folders, in step order."""
        return select_saves(items, hf_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """``trainer_state.json``, whether the sentinel exists; with ranks, the listing and their tails."""
        ranks = rank_files(Framework.HF, self.world_size)
        tails: tuple[str, ...] = ()
        if ranks and files is not None:
            sizes = {f.path: f.size for f in files}
            tails = tuple(in_save(save, n) for n in ranks if n in sizes and sizes[n] <= RNG_STATE_MAX_BYTES)
        return Needs(
            listing=bool(ranks),
            exists=(in_save(save, INCOMPLETE_SENTINEL),),
            heads=((in_save(save, TRAINER_STATE), _STATE_LIMIT),),
            tails=tails,
        )

    def judge(self, view: SaveView) -> str | None:
        """The Trainer's markers, and every rank's complete ``rng_state_<i>.pth`` with a world size > 1."""
        sizes = {f.path: f.size for f in view.files or ()}
        states: list[FileTail | None] = []
        for name in rank_files(Framework.HF, self.world_size):
            tail = view.tails.get(in_save(view.save, name))
            if tail is not None:
                states.append(FileTail(tail.size, tail.data, tail.span))
            elif sizes.get(name, 0) > RNG_STATE_MAX_BYTES:
                states.append(FileTail(sizes[name], b""))  # listed too large to be a rank's state: not read
            else:
                states.append(None)
        state_path = in_save(view.save, TRAINER_STATE)
        state = view.heads.get(state_path)
        end = None
        if state is not None and len(state) > _STATE_LIMIT:  # too large to parse: judged by its ends
            tail = view.tails.get(state_path)
            end = FileTail(len(state), b"") if tail is None else FileTail(tail.size, tail.data)
        markers = Markers(
            trainer_state=state,
            trainer_state_end=end,
            incomplete_sentinel=view.exists(in_save(view.save, INCOMPLETE_SENTINEL)),
            rank_states=tuple(states),
        )
        return check_markers(Framework.HF, markers, world_size=self.world_size)

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """One interval: the main process writes ``trainer_state.json`` while other ranks may still write."""
        return interval if given is None else given
