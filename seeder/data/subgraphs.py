"""Per-query bounded subgraphs, stored and handled column-wise (no Python object per query).

A ``SubgraphSet`` holds many queries' subgraphs as flat arrays with offsets, the same way a CSR holds
rows: query ``i`` owns nodes ``nodes[node_ptr[i]:node_ptr[i+1]]`` and edges
``edge_*[edge_ptr[i]:edge_ptr[i+1]]``. Edge endpoints are *local* indices into the query's node list.
Induced edges are the graph's directed edges among the subgraph's nodes, each once, with their base
relation id (< R); a consumer that wants both directions adds ``(dst, src, r + R)`` itself.

On disk (``ARTIFACTS/subgraphs/*.parquet``) one row is one query with list columns; the same class
reads them back and concatenates shards without per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seeder.data.ragged import offsets_of, ranges

SUBGRAPH_SCHEMA = pa.schema(
    [
        ("query_id", pa.int64()),
        ("split", pa.string()),
        ("nodes", pa.list_(pa.int64())),  # global node ids, seeds first
        ("hop", pa.list_(pa.int8())),  # 0 for seeds, h for nodes reached at hop h
        ("score", pa.list_(pa.float32())),  # K-HOP-WITH-FILTERING score (seeds: cosine to the query)
        ("is_answer", pa.list_(pa.bool_())),
        # Learned filter: log prior mass of the relation paths that end at the node's path from the
        # seed (the prior's answer signal); 0 with the cosine filter.
        ("path_end", pa.list_(pa.float32())),
        ("edge_src", pa.list_(pa.int32())),  # local indices
        ("edge_dst", pa.list_(pa.int32())),
        ("edge_rel", pa.list_(pa.int32())),  # base relation id, 0..R-1
        ("answers", pa.list_(pa.int64())),  # every answer of the query, inside the subgraph or not
    ]
)


def sorted_lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found, position) of each of ``keys`` (any shape) in the ascending ``sorted_keys``; the position
    is that of the first equal key, and meaningless where not found."""
    if len(sorted_keys) == 0:
        return np.zeros(np.shape(keys), dtype=bool), np.zeros(np.shape(keys), dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[pos] == keys, pos


def isin_sorted(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(values, pool)`` for integer keys: ``sorted_lookup`` of the sorted values in the sorted
    pool. np.isin hashes both arrays, several times slower on the tens of millions of edge keys of a
    graph update, and unsorted searches miss the cache."""
    found = np.zeros(len(values), dtype=bool)
    order = np.argsort(values)
    found[order] = sorted_lookup(np.sort(pool), values[order])[0]
    return found


def _gather_segments(ptr: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions of segments ``index`` (in that order) and the new offsets."""
    lengths = np.diff(ptr)[index]
    return ranges(ptr[:-1][index], lengths), offsets_of(lengths)


@dataclass
class SubgraphSet:
    query_ids: np.ndarray  # int64 [Q]
    splits: np.ndarray  # object [Q]
    node_ptr: np.ndarray  # int64 [Q+1]
    nodes: np.ndarray  # int64 [sum B_i]
    hop: np.ndarray  # int8
    score: np.ndarray  # float32
    is_answer: np.ndarray  # bool
    path_end: np.ndarray  # float32: log prior mass ending at the node's path (0 with the cosine filter)
    edge_ptr: np.ndarray  # int64 [Q+1]
    edge_src: np.ndarray  # int32, local
    edge_dst: np.ndarray  # int32, local
    edge_rel: np.ndarray  # int32, base relation
    answer_ptr: np.ndarray  # int64 [Q+1]
    answers: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.query_ids)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.node_ptr)

    @property
    def is_seed(self) -> np.ndarray:
        return self.hop == 0

    @property
    def num_answers(self) -> np.ndarray:
        return np.diff(self.answer_ptr)

    def take(self, index: np.ndarray) -> "SubgraphSet":
        """The subgraphs of queries at positions ``index``, in that order."""
        index = np.asarray(index, dtype=np.int64)
        node_pos, node_ptr = _gather_segments(self.node_ptr, index)
        edge_pos, edge_ptr = _gather_segments(self.edge_ptr, index)
        ans_pos, answer_ptr = _gather_segments(self.answer_ptr, index)
        return SubgraphSet(
            query_ids=self.query_ids[index],
            splits=self.splits[index],
            node_ptr=node_ptr,
            nodes=self.nodes[node_pos],
            hop=self.hop[node_pos],
            score=self.score[node_pos],
            is_answer=self.is_answer[node_pos],
            path_end=self.path_end[node_pos],
            edge_ptr=edge_ptr,
            edge_src=self.edge_src[edge_pos],
            edge_dst=self.edge_dst[edge_pos],
            edge_rel=self.edge_rel[edge_pos],
            answer_ptr=answer_ptr,
            answers=self.answers[ans_pos],
        )

    def select_split(self, split: str) -> "SubgraphSet":
        return self.take(np.flatnonzero(self.splits == split))

    # -- Arrow / Parquet -------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        def lists(ptr: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
            return pa.ListArray.from_arrays(pa.array(ptr.astype(np.int32)), pa.array(values, type=typ))

        columns = [
            pa.array(self.query_ids, pa.int64()),
            pa.array(self.splits.astype(str), pa.string()),
            lists(self.node_ptr, self.nodes, pa.int64()),
            lists(self.node_ptr, self.hop, pa.int8()),
            lists(self.node_ptr, self.score, pa.float32()),
            lists(self.node_ptr, self.is_answer, pa.bool_()),
            lists(self.node_ptr, self.path_end, pa.float32()),
            lists(self.edge_ptr, self.edge_src, pa.int32()),
            lists(self.edge_ptr, self.edge_dst, pa.int32()),
            lists(self.edge_ptr, self.edge_rel, pa.int32()),
            lists(self.answer_ptr, self.answers, pa.int64()),
        ]
        return pa.Table.from_arrays(columns, schema=SUBGRAPH_SCHEMA)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "SubgraphSet":
        table = table.select(SUBGRAPH_SCHEMA.names).cast(SUBGRAPH_SCHEMA).combine_chunks()

        def flat(name: str) -> tuple[np.ndarray, np.ndarray]:
            col = table.column(name).chunk(0) if table.num_rows else pa.array([], SUBGRAPH_SCHEMA.field(name).type)
            lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
            return offsets_of(lengths), values

        node_ptr, nodes = flat("nodes")
        edge_ptr, edge_src = flat("edge_src")
        answer_ptr, answers = flat("answers")
        return cls(
            query_ids=table.column("query_id").to_numpy(),
            splits=np.asarray(table.column("split").to_pylist(), dtype=object),
            node_ptr=node_ptr,
            nodes=nodes.astype(np.int64, copy=False),
            hop=flat("hop")[1].astype(np.int8, copy=False),
            score=flat("score")[1].astype(np.float32, copy=False),
            is_answer=flat("is_answer")[1].astype(bool, copy=False),
            path_end=flat("path_end")[1].astype(np.float32, copy=False),
            edge_ptr=edge_ptr,
            edge_src=edge_src.astype(np.int32, copy=False),
            edge_dst=flat("edge_dst")[1].astype(np.int32, copy=False),
            edge_rel=flat("edge_rel")[1].astype(np.int32, copy=False),
            answer_ptr=answer_ptr,
            answers=answers.astype(np.int64, copy=False),
        )

    @classmethod
    def concat(cls, parts: list["SubgraphSet"]) -> "SubgraphSet":
        if not parts:
            return cls.from_arrow(SUBGRAPH_SCHEMA.empty_table())
        return cls.from_arrow(pa.concat_tables([p.to_arrow() for p in parts]))

    @classmethod
    def read(cls, directory: str | Path, split: str | None = None, ordered: bool = True) -> "SubgraphSet":
        """Read every ``*.parquet`` shard in ``directory`` (optionally one split), ordered by query id;
        ``ordered=False`` keeps the shards' order, for a reader whose result does not depend on it."""
        files = sorted(Path(directory).glob("*.parquet"))
        filters = [("split", "=", split)] if split else None
        table = pq.read_table(files, filters=filters, schema=SUBGRAPH_SCHEMA) if files else SUBGRAPH_SCHEMA.empty_table()
        subgraphs = cls.from_arrow(table)
        # Shards are written in query-id order (an update's kept rows aside): the reorder is mostly skipped.
        ids = subgraphs.query_ids
        if ordered and len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
            subgraphs = subgraphs.take(np.argsort(ids, kind="stable"))
        return subgraphs

    def equals(self, other: "SubgraphSet") -> bool:
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
