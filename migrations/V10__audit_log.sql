-- The audit log (docs/api.md §18.4): one row per security-relevant action, appended by the
-- transaction that performs the action (src/db/audit.rs), so an action and its entry commit or
-- roll back together.
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    -- Who: a username, or NULL for the server itself (start-up).
    actor       text,
    action      text NOT NULL,
    -- What it acted on: a username, a bundle version, a form spec, an export job.
    target      text,
    client_ip   inet,
    request_id  text,
    node        text NOT NULL,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb
);

-- Listings are newest first (by id) with optional filters on actor, action and time.
CREATE INDEX audit_log_actor ON audit_log (actor, id);
CREATE INDEX audit_log_action ON audit_log (action, id);
CREATE INDEX audit_log_at ON audit_log (at);

-- Append-only, enforced here rather than trusted to the code: UPDATE is always refused, DELETE and
-- TRUNCATE only in a transaction that said `SET LOCAL synkronus.audit_sweep = 'on'`, which only
-- the retention sweep (AUDIT_RETENTION_DAYS) does.
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') AND current_setting('synkronus.audit_sweep', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER audit_log_no_update_or_delete
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
