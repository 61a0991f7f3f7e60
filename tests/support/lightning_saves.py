"""Lightning sharded saves file by file, as Lightning's FSDP and ModelParallel strategies write them.

From the installed sources (lightning 2.6, torch 2.13): ``lightning/pytorch/strategies/model_parallel.py``
``save_checkpoint`` (and ``fsdp.py``'s, ``state_dict_type="sharded"``): every rank makes the folder
``<filepath>`` (``path.mkdir(parents=True, exist_ok=True)``), then ``_distributed_checkpoint_save``
(``lightning/fabric/strategies/fsdp.py``) calls ``torch.distributed.checkpoint.save(state,
checkpoint_id=path)``: each rank writes its shard ``__<rank>_0.distcp`` in place
(``torch/distributed/checkpoint/filesystem.py`` ``FileSystemWriter.write_data``, one file per rank); the
coordinator (rank 0), once it has every rank's write result, writes ``.metadata.tmp`` and renames it to
``.metadata`` (``finish``). Then global rank 0 ``torch.save``\\ s the rest of the state into ``meta.pt``, in
place: a zip whose end records come last. The trainer's barrier follows, then the publication.

:func:`sharded_states` is that sequence cut at every file boundary (and inside ``meta.pt``), as the trees
a reader can see, in order; only the last is a whole save.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import attrs

__all__ = ["State", "meta_pt", "sharded_states", "write_tree"]


def meta_pt() -> bytes:
    """A real ``meta.pt``: what ``torch.save`` writes for Lightning's non-tensor state."""
    import torch

    buffer = io.BytesIO()
    torch.save({"global_step": 4, "epoch": 0, "loops": {"fit_loop": {"state": "x" * 200}}}, buffer)
    return buffer.getvalue()


@attrs.frozen
class State:
    """One moment of the save: ``files`` maps paths inside ``model.ckpt/`` to their bytes so far."""

    name: str
    files: dict[str, bytes]
    whole: bool = False


def sharded_states(ranks: int = 2) -> list[State]:
    """The trees of one ``ranks``-process sharded save, from the empty folder to the whole save."""
    shards = {f"__{rank}_0.distcp": bytes((rank + i) % 251 for i in range(3000)) for rank in range(ranks)}
    metadata = pickle.dumps({"storage_data": sorted(shards), "version": "2.13"})
    meta = meta_pt()
    states = [State("folder made", {})]
    files: dict[str, bytes] = {}
    for name, data in shards.items():  # each rank's shard: created, then written in place
        files[name] = b""
        states.append(State(f"{name} created", dict(files)))
        files[name] = data[: len(data) // 2]
        states.append(State(f"{name} half written", dict(files)))
        files[name] = data
        states.append(State(f"{name} written", dict(files)))
    files[".metadata.tmp"] = b""
    states.append(State(".metadata.tmp created", dict(files)))
    files[".metadata.tmp"] = metadata
    states.append(State(".metadata.tmp written", dict(files)))
    del files[".metadata.tmp"]
    files[".metadata"] = metadata
    states.append(State(".metadata renamed into place", dict(files)))
    for cut, what in (
        (0, "created"),
        (len(meta) // 2, "half written"),
        (len(meta) - 1, "all but its last byte"),
    ):
        files["meta.pt"] = meta[:cut]
        states.append(State(f"meta.pt {what}", dict(files)))
    files["meta.pt"] = meta
    states.append(State("meta.pt written", dict(files), whole=True))
    return states


def write_tree(checkpoint: Path, files: dict[str, bytes]) -> None:
    """Lay ``files`` out under the sharded checkpoint folder ``checkpoint`` (made even when empty)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (checkpoint / name).write_bytes(data)
