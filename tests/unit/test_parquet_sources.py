"""Parquet files read row group by row group: one that cannot be read fails its rows, the next is read."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from gemma_embed.sources import Collection, iter_sources


def test_a_row_group_that_cannot_be_read_fails_its_rows_and_the_next_is_read(tmp_path):
    path = tmp_path / "t.parquet"
    blobs = [os.urandom(3000) for _ in range(4)]
    table = pa.table({"image": pa.array(blobs, pa.binary())})
    pq.write_table(table, path, row_group_size=2, compression="snappy", use_dictionary=False)
    first_chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    raw = bytearray(path.read_bytes())
    middle = first_chunk.data_page_offset + first_chunk.total_compressed_size // 2
    raw[middle : middle + 64] = b"\xff" * 64  # the first row group's page no longer decompresses
    path.write_bytes(bytes(raw))
    found = list(iter_sources([str(path)], "images", collection=Collection("image")))
    assert [s.key for s in found] == [f"{path}:{row}" for row in range(4)]
    assert [s.error is not None for s in found] == [True, True, False, False]
    assert found[0].error.startswith("row group 0 cannot be read (")
    assert [bytes(s.data) for s in found[2:]] == blobs[2:]
