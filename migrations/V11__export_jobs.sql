-- Export jobs (docs/api.md §13.4, §18.2) live here rather than in one process's memory, so a job
-- started through one node is polled and downloaded through any other.
--
-- The node running a job (`node`, its NODE_ID) writes its progress and renews
-- `lease_expires_at` while the job is queued or running; any node turns a job whose lease has
-- expired into `failed` (its node died). The finished file lives under DATA_ROOT/exports/
-- (`file_name`), shared by the nodes; the row and the file go together when `expires_at` passes.
CREATE TABLE export_jobs (
    id                text PRIMARY KEY,
    owner             text NOT NULL,
    format            text NOT NULL,
    -- {form_types, since_change_id, include_deleted}, as the job was asked for.
    filters           jsonb NOT NULL,
    state             text NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
    rows_done         bigint NOT NULL DEFAULT 0,
    rows_total        bigint,
    -- The snapshot head, once the job has taken its snapshot.
    change_id         bigint,
    error             text,
    node              text NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    file_name         text NOT NULL,
    created_at        timestamptz NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz,
    expires_at        timestamptz
);

CREATE INDEX export_jobs_unfinished ON export_jobs (lease_expires_at) WHERE state IN ('queued', 'running');
CREATE INDEX export_jobs_expiry ON export_jobs (expires_at) WHERE expires_at IS NOT NULL;
