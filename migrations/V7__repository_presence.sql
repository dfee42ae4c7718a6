-- The repository generation (API.md 17.2): raised by each admin reset so devices holding data
-- from before the reset learn they must start over. It lives beside the change head because both
-- are read in the same snapshot and changed under the same change-log lock.
ALTER TABLE change_head ADD COLUMN repository_generation bigint NOT NULL DEFAULT 1;

-- Device presence (API.md 17.4), written in batches by the Presence actor.
CREATE TABLE device_presence (
    username            text NOT NULL REFERENCES users(username) ON DELETE CASCADE,
    client_id           text NOT NULL,
    last_seen_at        timestamptz NOT NULL,
    last_data_version   bigint,
    app_bundle_version  text,
    client_version      text,
    PRIMARY KEY (username, client_id)
);
CREATE INDEX device_presence_last_seen ON device_presence (last_seen_at);
