"""ferry.embed: the embedding-offload core (n-gram row ids, tables, row gathering).

::

    import numpy as np, ferry

    layout = ferry.embed.Layout(ferry.embed.Config.model(eos_id=1))
    ids = layout.row_ids(tokens, query_start_loc, ngram_context)   # uint64 [T, 16]
    table = ferry.embed.Table.synthetic(small_layout, "bf16", threads=2)
    out = np.empty((T, 2560), np.uint16)                           # bf16 bits
    ferry.embed.Gatherer(threads=2).gather(table, ids, out)

Token ids are int32 (any integer dtype is accepted); negative ids read as 0; ids >= vocab_size
raise ferry.Error("OUT_OF_RANGE", ...). Row ids of padding tokens are PADDING_ROW and their
rows are zeros. src/embed/row_ids.h states the specification and its decisions.
"""

from ._ferry import embed as _embed

Config = _embed.Config
Layout = _embed.Layout
Table = _embed.Table
Gatherer = _embed.Gatherer
synthetic_row = _embed.synthetic_row
PADDING_ROW = _embed.PADDING_ROW

__all__ = ["Config", "Gatherer", "Layout", "PADDING_ROW", "Table", "synthetic_row"]
