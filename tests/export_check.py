#!/usr/bin/env python3
"""Checks that an export ZIP opens in third-party readers (optional; needs
`pip install pyarrow duckdb`). Not used by the Rust tests.

    python3 tests/export_check.py EXPORT.zip [more.zip ...]

Every `.parquet` entry must open in pyarrow and duckdb with the fixed columns of
docs/api.md §13.2 first; every `.csv` entry must parse in duckdb with the same header.
"""
import io
import os
import sys
import tempfile
import zipfile

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

FIXED = [
    "observation_id", "form_type", "form_version", "created_at", "updated_at",
    "deleted", "version", "data", "synced_at", "geolocation", "author",
    "device_id", "tags",
]


def check_parquet(name, raw, tmp):
    table = pq.read_table(io.BytesIO(raw))
    assert table.column_names[:len(FIXED)] == FIXED, table.column_names
    data_cols = table.column_names[len(FIXED):]
    assert all(c.startswith("data_") for c in data_cols), data_cols
    assert data_cols == sorted(data_cols), data_cols
    assert table.schema.field("synced_at").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("version").type == pa.int64()
    meta = pq.ParquetFile(io.BytesIO(raw)).metadata
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        assert rg.num_rows <= 10_000, rg.num_rows
        assert rg.column(0).compression == "SNAPPY", rg.column(0).compression
    versions = table.column("version").to_pylist()
    assert versions == sorted(versions), "rows must be ordered by change_id"

    path = os.path.join(tmp, "entry.parquet")
    with open(path, "wb") as f:
        f.write(raw)
    con = duckdb.connect()
    # Every cell as text: decodes each column without needing pytz for TIMESTAMPTZ.
    rows = con.execute(
        f"SELECT COLUMNS(*)::VARCHAR FROM read_parquet('{path}') ORDER BY version").fetchall()
    assert len(rows) == table.num_rows, (len(rows), table.num_rows)
    (tz_ok,) = con.execute(
        f"SELECT bool_and(typeof(synced_at) = 'TIMESTAMP WITH TIME ZONE') "
        f"FROM read_parquet('{path}')").fetchone()
    assert tz_ok in (True, None), "synced_at must be a UTC-adjusted timestamp"
    print(f"  {name}: {table.num_rows} rows, {meta.num_row_groups} row groups, "
          f"{len(data_cols)} data columns: OK (pyarrow, duckdb)")


def check_csv(name, raw, tmp):
    assert not raw.startswith(b"\xef\xbb\xbf"), "no BOM"
    header = raw.split(b"\r\n", 1)[0].decode("utf-8").split(",")
    assert header[:len(FIXED)] == FIXED, header
    path = os.path.join(tmp, "entry.csv")
    with open(path, "wb") as f:
        f.write(raw)
    con = duckdb.connect()
    described = con.execute(
        f"DESCRIBE SELECT * FROM read_csv('{path}', header = true)").fetchall()
    types = {row[0]: row[1] for row in described}
    assert [row[0] for row in described] == header, described
    # RFC 3339 with Z is recognised as an instant, `true`/`false` as booleans.
    assert types["synced_at"] == "TIMESTAMP WITH TIME ZONE", types["synced_at"]
    assert types["deleted"] == "BOOLEAN", types["deleted"]
    (count,) = con.execute(
        f"SELECT count(*) FROM (SELECT COLUMNS(*)::VARCHAR FROM read_csv('{path}', header = true))"
    ).fetchone()
    print(f"  {name}: {count} rows: OK (duckdb)")


def main(paths):
    for path in paths:
        print(path)
        with zipfile.ZipFile(path) as zf, tempfile.TemporaryDirectory() as tmp:
            assert zf.testzip() is None, "CRC mismatch"
            infos = zf.infolist()
            if not infos:
                print("  empty archive: OK")
            for info in infos:
                assert "/" not in info.filename or info.filename.endswith(".json"), info.filename
                raw = zf.read(info)
                if info.filename.endswith(".parquet"):
                    assert info.compress_type == zipfile.ZIP_STORED
                    check_parquet(info.filename, raw, tmp)
                elif info.filename.endswith(".csv"):
                    assert info.compress_type == zipfile.ZIP_DEFLATED
                    check_csv(info.filename, raw, tmp)
                else:
                    raise AssertionError(f"unexpected entry {info.filename}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
