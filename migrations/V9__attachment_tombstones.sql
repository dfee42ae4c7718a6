-- Deleted attachments (docs/api.md §19.2): an import from Go Synkronus brings attachments that
-- were deleted there. Devices holding a cursor from before the deletion must still learn about
-- it, so each becomes a tombstone at its delete version, listed by both attachment manifests as a
-- `delete` operation. A later upload of the same id removes the tombstone in its own transaction.
CREATE TABLE attachment_tombstones (
    id          text PRIMARY KEY,
    change_id   bigint NOT NULL UNIQUE,
    client_id   text,
    deleted_at  timestamptz NOT NULL
);
