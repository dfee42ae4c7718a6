CREATE EXTENSION IF NOT EXISTS "uuid-ossp";

CREATE TABLE users (
    id               uuid PRIMARY KEY DEFAULT uuid_generate_v4(),
    username         text NOT NULL UNIQUE,
    email            text,
    password_hash    text NOT NULL,
    role             text NOT NULL CHECK (role IN ('read-only', 'read-write', 'admin')),
    -- Raised by password change/reset, role change and deletion: older tokens stop working.
    token_generation bigint NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_login       timestamptz
);

CREATE TABLE refresh_tokens (
    id          uuid PRIMARY KEY DEFAULT uuid_generate_v4(),
    token_hash  bytea NOT NULL UNIQUE,
    user_id     uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    -- Every token descended from one login shares a family; reuse revokes the whole family.
    family_id   uuid NOT NULL,
    issued_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX refresh_tokens_family ON refresh_tokens (family_id);
CREATE INDEX refresh_tokens_user ON refresh_tokens (user_id);

-- Access tokens revoked by logout, kept until they would have expired anyway.
CREATE TABLE revoked_tokens (
    jti        text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
