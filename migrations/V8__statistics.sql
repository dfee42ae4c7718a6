-- Statistics at any size (docs/api.md §18.4): the counts behind GET /stats/observations and
-- GET /status live in these tables. Every change to `records` and `attachments` updates them in
-- its own transaction (src/db/stats.rs), so they equal a full count at every moment and are read
-- in milliseconds whatever the size of the repository.

-- Records by form type, UTC day of creation and deletion flag. `day` is '-infinity' for a record
-- without a creation date (rows written before the server always set one): such a record counts
-- in the totals and per form type, in no timeline bucket. Rows whose count fell to zero are
-- removed by the transaction that emptied them.
CREATE TABLE observation_counts (
    form_type  text NOT NULL,
    day        date NOT NULL,
    deleted    boolean NOT NULL,
    n          bigint NOT NULL,
    PRIMARY KEY (form_type, day, deleted)
);

INSERT INTO observation_counts (form_type, day, deleted, n)
SELECT form_type, coalesce((created_at AT TIME ZONE 'UTC')::date, '-infinity'), deleted, count(*)
FROM records
GROUP BY 1, 2, 3;

-- The number of attachment rows.
CREATE TABLE attachment_count (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    n          bigint NOT NULL
);

INSERT INTO attachment_count (n) SELECT count(*) FROM attachments;
