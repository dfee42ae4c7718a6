-- A scoped user's attachment manifest lists the uploads after its cursor that the user may
-- download. Checking every upload of the fleet since the device's last sync made the manifest
-- cost grow with the fleet's uploads, for every device (docs/architecture.md, "Scoped sync":
-- attachments). So an upload is written under the keys of the records that name it, as it
-- commits, and a manifest reads its user's keys' uploads instead.

-- The uploads of attachments that records name, under each live key of those records and the
-- personal key of each record's author (`@<username>`), at the upload's change_id. Written only
-- while a set is in force; emptied when a set switches (no manifest reads older rows, see
-- `scope_user_keys.since`).
CREATE TABLE scope_uploads (
    key           text COLLATE "C" NOT NULL,
    change_id     bigint NOT NULL,
    attachment_id text NOT NULL,
    PRIMARY KEY (key, change_id)
);

-- The change head when the user's keys took their present value: a manifest after a cursor at
-- or above it finds every upload the user may download in `scope_uploads`; one below it (the
-- keys changed since, or a set switched) checks every upload after the cursor. Rows that exist
-- now date from before any upload was written under a key, so they start at the head.
ALTER TABLE scope_user_keys ADD COLUMN since bigint;
UPDATE scope_user_keys SET since = (SELECT head FROM change_head);
ALTER TABLE scope_user_keys ALTER COLUMN since SET NOT NULL;

-- A manifest's own uploads after its cursor, read along the index instead of every upload of
-- the user.
CREATE INDEX attachments_uploaded_by_change ON attachments (uploaded_by, change_id);
DROP INDEX attachments_uploaded_by;
