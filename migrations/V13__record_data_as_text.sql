-- A record's `data` is stored as text instead of `json`. The server has parsed every byte of it
-- before it writes it (a push's records are decoded one by one, an import reads jsonb), and
-- nothing in SQL looks inside it, yet PostgreSQL parsed it once more on every insert: about a
-- fifth of a push storm's rate (BENCHMARKS.md, "Push: record data as text"). The text is the same
-- text: clients still get back exactly the number text they sent. Both tables are rewritten once
-- (about 9 s per million records on a 2-core machine); `geolocation` and `tags`, small and
-- mostly absent, stay `json`.
ALTER TABLE records ALTER COLUMN data TYPE text;
ALTER TABLE record_revisions ALTER COLUMN data TYPE text;
