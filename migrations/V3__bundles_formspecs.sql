-- Every app bundle version id ever assigned (API.md 9.3). Rows are never deleted: retention only
-- sets removed_at, so an id can never be handed out twice.
CREATE TABLE bundle_versions (
    version      text PRIMARY KEY,
    -- Upload order: "newest" means the highest seq, not the lexical order of ids.
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    name         text NOT NULL,
    entry_point  text NOT NULL,
    created_at   timestamptz NOT NULL,
    -- The GET /app-bundle/manifest body, computed once so its hash (the ETag) never changes.
    manifest     jsonb NOT NULL,
    removed_at   timestamptz
);

-- The active pointer. generation rises with every change so that processes applying
-- notifications or periodic re-reads out of order never go back to an older state.
CREATE TABLE bundle_active (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version     text REFERENCES bundle_versions (version),
    generation  bigint NOT NULL
);
INSERT INTO bundle_active (version, generation) VALUES (NULL, 0);

-- Form specifications (API.md 11).
CREATE TABLE form_specs (
    form_type   text NOT NULL,
    version     text NOT NULL,
    schema      jsonb NOT NULL,
    uischema    jsonb NOT NULL,
    source      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    seq         bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    PRIMARY KEY (form_type, version)
);

-- The forms each bundle version carried when it was activated, for the record-validation
-- fallback of API.md 8.4 ("the spec that the active bundle registered for that form type").
CREATE TABLE bundle_forms (
    bundle_version  text NOT NULL REFERENCES bundle_versions (version),
    form_type       text NOT NULL,
    spec_version    text NOT NULL,
    schema          jsonb NOT NULL,
    PRIMARY KEY (bundle_version, form_type)
);
