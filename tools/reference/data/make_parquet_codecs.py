"""Parquet fixtures for the codecs and column types other writers use (pyarrow only):

    python tools/reference/data/make_parquet_codecs.py     # a Python with pyarrow

Writes, under parquet/ next to this script:
  chat_{zstd,gzip,lz4,brotli}.parquet  chat.parquet's table rewritten with that codec (polars
                                       writes zstd by default); the rows must read the same
  text_binary.parquet                  a `text` column of type binary (no UTF-8 annotation, as
                                       older writers store strings): two UTF-8 rows, then one
                                       that is not UTF-8
"""

import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parquet")


def main():
    print(f"pyarrow {pa.__version__}")
    chat = pq.read_table(os.path.join(HERE, "chat.parquet"))
    for codec in ["zstd", "gzip", "lz4", "brotli"]:
        name = f"chat_{codec}.parquet"
        pq.write_table(chat, os.path.join(HERE, name), compression=codec, row_group_size=2)
        print(f"wrote {name}: {chat.num_rows} rows")
    text = pa.table({"text": pa.array([b"hello world", "caf\u00e9 au lait".encode(), b"\xff\xfe"], pa.binary())})
    pq.write_table(text, os.path.join(HERE, "text_binary.parquet"))
    print("wrote text_binary.parquet: 3 rows")


if __name__ == "__main__":
    main()
