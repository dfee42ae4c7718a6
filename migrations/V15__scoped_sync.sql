-- Scoped sync (docs/api.md §20; the design and why it keeps the pull guarantees:
-- docs/architecture.md, "Scoped sync"). With no scope set (the default) none of these tables is
-- read by a pull or written by a push.

-- Attributes that scope rules compare record fields with: {"district": ["north", "east"]}.
ALTER TABLE users ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}'::jsonb;

-- Every version of the scope set. `rules` is NULL for a version that returns to "no set".
CREATE TABLE scope_sets (
    version      bigint PRIMARY KEY CHECK (version > 0),
    rules        jsonb,
    state        text NOT NULL CHECK (state IN ('preparing', 'active', 'retired', 'replaced')),
    created_at   timestamptz NOT NULL,
    created_by   text NOT NULL,
    activated_at timestamptz,
    -- The preparation's redelivery event and its resumable position: the last record id scanned,
    -- the change head the scan started from (records changed after it are caught up before the
    -- switch), the slots handed out so far, and the records to scan (for progress).
    event_id     bigint,
    scan_after   text,
    scan_head    bigint,
    slots        bigint NOT NULL DEFAULT 0,
    scanned      bigint NOT NULL DEFAULT 0,
    to_scan      bigint NOT NULL DEFAULT 0
);

-- The set in force (0: none) and the one being prepared. Changed only under the change-log lock,
-- so a commit that reads it there knows which families of keys it must write.
CREATE TABLE scope_state (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    active_version    bigint NOT NULL DEFAULT 0,
    preparing_version bigint,
    revision          bigint NOT NULL DEFAULT 0,
    -- Set when a switch or a replaced preparation leaves rows no set uses; cleared by the sweep.
    gc_pending        boolean NOT NULL DEFAULT false
);
INSERT INTO scope_state DEFAULT VALUES;

-- A record's place in each bucket it is or was in: the latest change that put it there
-- (`live`) or took it out (not `live`). Keys are `f<family>[=value]` or `@<username>` (a
-- delivery addressed to one user). The "C" collation lets a family's keys be read as a range.
CREATE TABLE scope_rows (
    key       text COLLATE "C" NOT NULL,
    record_id text NOT NULL,
    change_id bigint NOT NULL,
    live      boolean NOT NULL,
    PRIMARY KEY (key, record_id)
);
CREATE INDEX scope_rows_key_change ON scope_rows (key, change_id);
CREATE INDEX scope_rows_record ON scope_rows (record_id);

-- Each non-admin user's keys under the set in force, their personal key included. Written with
-- the set's switch and with every change of the user's role or attributes, under the change-log
-- lock, and read by the pull in the page's own snapshot.
CREATE TABLE scope_user_keys (
    username text PRIMARY KEY REFERENCES users(username) ON DELETE CASCADE ON UPDATE CASCADE,
    keys     text[] COLLATE "C" NOT NULL
);

-- Redeliveries. When what a user may see changes (a new set, new attributes, a new role), every
-- record in a bucket that changed hands gets a slot in a block of change_ids taken after the
-- head at that moment: its devices receive it again there (live or as a tombstone), above any
-- cursor they hold. `base` is NULL until the block is committed.
CREATE TABLE scope_events (
    id         bigserial PRIMARY KEY,
    base       bigint,
    size       bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- Which keys changed hands for whom in each event.
CREATE TABLE scope_event_users (
    username text NOT NULL,
    event_id bigint NOT NULL REFERENCES scope_events(id) ON DELETE CASCADE,
    keys     text[] COLLATE "C" NOT NULL,
    PRIMARY KEY (username, event_id)
);
-- A record has one slot per event, listed under every changed key it was in.
CREATE TABLE scope_event_slots (
    event_id  bigint NOT NULL REFERENCES scope_events(id) ON DELETE CASCADE,
    key       text COLLATE "C" NOT NULL,
    slot      bigint NOT NULL,
    record_id text NOT NULL,
    PRIMARY KEY (event_id, key, slot)
);
CREATE UNIQUE INDEX scope_event_slots_record ON scope_event_slots (event_id, record_id, key);

-- Which attachments a record's data names (a string equal to the attachment id), kept while a
-- scope set is in force or being prepared: a user may download an attachment that a record they
-- may see names (docs/api.md §20.4).
CREATE TABLE attachment_refs (
    attachment_id text NOT NULL,
    record_id     text NOT NULL,
    PRIMARY KEY (attachment_id, record_id)
);
CREATE INDEX attachment_refs_record ON attachment_refs (record_id);
-- A scoped user's first attachment manifest lists their own uploads.
CREATE INDEX attachments_uploaded_by ON attachments (uploaded_by);

-- Devices that started from cursor 0, and the head when they did: a redelivery committed before
-- that is not theirs (they never held what it changes), so an initial sync reads only the keys'
-- rows, in proportion to what the user receives.
CREATE TABLE scope_devices (
    username    text NOT NULL,
    client_id   text NOT NULL,
    fresh_since bigint NOT NULL,
    PRIMARY KEY (username, client_id)
);
