-- Read your writes with read replicas (API.md 18.3): each user's newest acknowledged write,
-- written by the transaction that makes the write and read from the primary before a read goes
-- to a replica. `change_id` is the change head of the user's newest change-numbered write (a
-- push's group commit, an attachment upload): a replica showing that head shows the write.
-- `writes` counts the user's other writes (user, bundle, form spec changes, a repository reset):
-- a replica showing the same count in this table has replayed them. No foreign key: a mark of a
-- deleted user is harmless, and keeping it costs nothing.
CREATE TABLE write_marks (
    username   text PRIMARY KEY,
    change_id  bigint NOT NULL DEFAULT 0,
    writes     bigint NOT NULL DEFAULT 0
);
