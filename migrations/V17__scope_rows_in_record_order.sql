-- Scoped sync's key rows (V15) keyed in record order: the primary key (record_id, key) serves the
-- commit's upserts, the updates of one record's rows and every lookup by record, which the record
-- index it replaces served, so each key a commit writes updates two indexes instead of three.
-- Quick: the table stays empty until a scope set is first used.
ALTER TABLE scope_rows DROP CONSTRAINT scope_rows_pkey;
ALTER TABLE scope_rows ADD PRIMARY KEY (record_id, key);
DROP INDEX scope_rows_record;
