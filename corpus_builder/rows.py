"""The Arrow row form of a ``Conversation``: the on-disk schema and the one place the two forms convert.

A row is a ``Conversation`` in the pipeline and an Arrow record (``ARROW_SCHEMA``) in shards and files;
``conversations_to_batch`` and ``batch_to_conversations`` are the only conversions between them.
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .records import Conversation, Message

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning", pa.string())])
ARROW_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("origin", pa.string()),
    ("task", pa.string()),
    ("license", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("thinking", pa.bool_()),
    ("flags", pa.list_(pa.string())),
    ("split", pa.string()),
    ("provenance", pa.string()),  # JSON-encoded object: its keys differ between replayed and generated rows
])


def conversations_to_batch(conversations: list[Conversation]) -> pa.RecordBatch:
    """Column-wise conversion with flat message arrays: far cheaper than a dict per row or per turn.

    ``thinking`` is computed on the turn arrays in one vectorised pass, not by a generator per conversation.
    """
    messages = [message for conversation in conversations for message in conversation.messages]
    offsets = np.zeros(len(conversations) + 1, dtype=np.int32)
    np.cumsum([len(conversation.messages) for conversation in conversations], dtype=np.int32, out=offsets[1:])
    roles = pa.array([m.role for m in messages], pa.string())
    reasonings = pa.array([m.reasoning for m in messages], pa.string())
    turns = pa.StructArray.from_arrays([roles, pa.array([m.content for m in messages], pa.string()), reasonings],
                                       fields=list(MESSAGE_TYPE))
    columns = [
        pa.array([c.id for c in conversations], pa.string()),
        pa.array([c.source for c in conversations], pa.string()),
        pa.array([c.origin for c in conversations], pa.string()),
        pa.array([c.task for c in conversations], pa.string()),
        pa.array([c.license for c in conversations], pa.string()),
        pa.ListArray.from_arrays(pa.array(offsets), turns, type=ARROW_SCHEMA.field("messages").type),
        pa.array(_thinking(offsets, roles, reasonings), pa.bool_()),
        pa.array([c.flags for c in conversations], pa.list_(pa.string())),
        pa.array([c.split for c in conversations], pa.string()),
        pa.array([orjson.dumps(c.provenance).decode() for c in conversations], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _thinking(offsets: np.ndarray, roles: pa.Array, reasonings: pa.Array) -> np.ndarray:
    """Conversation.thinking for every conversation: some assistant turn has a non-empty reasoning."""
    reasoned = pc.and_(pc.equal(roles, "assistant"), pc.greater(pc.binary_length(reasonings), 0))
    running = np.zeros(len(roles) + 1, dtype=np.int64)
    np.cumsum(pc.fill_null(reasoned, False).to_numpy(zero_copy_only=False), out=running[1:])
    thinking: np.ndarray = running[offsets[1:]] > running[offsets[:-1]]
    return thinking


def batch_to_conversations(batch: pa.RecordBatch) -> list[Conversation]:
    """The rows of a batch (a shard's, or a raw file's converted batch) as conversations."""
    conversations = []
    for row in batch.to_pylist():
        provenance = row.get("provenance") or {}
        if isinstance(provenance, str):
            provenance = orjson.loads(provenance)
        conversations.append(Conversation(
            id=row["id"], source=row["source"], origin=row["origin"],
            messages=[Message(m["role"], m["content"], m.get("reasoning")) for m in row["messages"]],
            task=row.get("task"), license=row.get("license"), flags=list(row.get("flags") or []),
            provenance=provenance, split=row.get("split")))
    return conversations
