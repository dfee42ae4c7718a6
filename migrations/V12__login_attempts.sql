-- The login rate limit for the whole cluster (docs/api.md §15, §18.2): every node counts the
-- attempts of a (client IP, username) pair in this one row, so a client cannot multiply its
-- allowance by the number of nodes behind the load balancer.
--
-- `attempts` holds the counted attempts of the last 60 s, oldest first (at most
-- RATE_LIMIT_LOGIN_PER_MIN of them): one upsert per attempt drops the ones that left the window
-- and appends the new one when there is room (src/db/login_attempts.rs). The username is kept
-- as its SHA-256, so a username of any length keys a row and no table lists who was tried.
-- Rows whose newest attempt left the window are swept every minute.
CREATE TABLE login_attempts (
    client_ip      inet NOT NULL,
    username_hash  bytea NOT NULL,
    attempts       timestamptz[] NOT NULL,
    -- Whether the latest attempt was counted (false: refused with 429).
    counted        boolean NOT NULL,
    PRIMARY KEY (client_ip, username_hash)
);
