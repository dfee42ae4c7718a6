-- The change log head: the highest committed change_id. It is updated in the same transaction
-- that writes the changes, under one advisory lock, so a reader that sees head N sees every
-- change <= N (API.md 8.2, P1).
CREATE TABLE change_head (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    head       bigint NOT NULL
);
INSERT INTO change_head (head) VALUES (0);

-- Current state of each observation; change_id is the id of its latest change.
-- `data`, `geolocation` and `tags` are `json`, not `jsonb`: clients get back exactly the number
-- text they sent (1e300 stays 1e300), and json is cheaper to write on the hot push path.
CREATE TABLE records (
    id            text PRIMARY KEY,
    form_type     text NOT NULL,
    form_version  text NOT NULL,
    data          json NOT NULL,
    deleted       boolean NOT NULL,
    created_at    timestamptz,
    updated_at    timestamptz,
    synced_at     timestamptz NOT NULL,
    geolocation   json,
    author        text,
    device_id     text,
    tags          json,
    change_id     bigint NOT NULL UNIQUE,
    created_by    text NOT NULL,
    -- Provenance of the current revision (history shows it with the superseded ones).
    client_id         text NOT NULL DEFAULT '',
    transmission_id   text,
    pushed_by         text NOT NULL DEFAULT '',
    overwrote_version bigint,
    conflict          boolean NOT NULL DEFAULT false
);
CREATE INDEX records_form_type_change ON records (form_type, change_id);
CREATE INDEX records_created_by_change ON records (created_by, change_id);

-- Every superseded revision: when a push overwrites a record, its previous state moves here, so
-- overwritten data is never lost. The current revision lives in `records` only, which keeps the
-- common case (a new record) to one row write.
CREATE TABLE record_revisions (
    change_id         bigint PRIMARY KEY,
    record_id         text NOT NULL,
    form_type         text NOT NULL,
    form_version      text NOT NULL,
    data              json NOT NULL,
    deleted           boolean NOT NULL,
    created_at        timestamptz,
    updated_at        timestamptz,
    synced_at         timestamptz NOT NULL,
    geolocation       json,
    author            text,
    device_id         text,
    tags              json,
    client_id         text NOT NULL,
    transmission_id   text,
    pushed_by         text NOT NULL,
    overwrote_version bigint,
    conflict          boolean NOT NULL
);
CREATE INDEX record_revisions_record ON record_revisions (record_id, change_id DESC);

-- Push results kept for idempotent replay (API.md 8.6).
CREATE TABLE transmissions (
    client_id       text NOT NULL,
    transmission_id text NOT NULL,
    fingerprint     bytea NOT NULL,
    result          jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, transmission_id)
);
CREATE INDEX transmissions_created ON transmissions (created_at);
