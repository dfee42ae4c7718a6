-- Attachment metadata. Files are stored by content (sha256) on disk, so an id maps to immutable
-- bytes and two uploads racing with different bytes can never overwrite each other's file.
CREATE TABLE attachments (
    id            text PRIMARY KEY,
    sha256        text NOT NULL,
    size          bigint NOT NULL,
    content_type  text NOT NULL,
    uploaded_by   text NOT NULL,
    client_id     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    change_id     bigint NOT NULL UNIQUE
);
CREATE INDEX attachments_sha256 ON attachments (sha256);
CREATE INDEX attachments_created_at ON attachments (created_at);
