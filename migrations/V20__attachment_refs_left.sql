-- A reference a record no longer holds (its data was changed to name another photo, or none) is
-- kept, marked with the change at which the record dropped it: the scoped manifest after a cursor
-- below that change lists the attachment, as `delete` when nothing else lets the user have it
-- (docs/api.md §20.4: an attachment that leaves the caller's set is listed once as `delete`).
-- NULL: the record names it now.
ALTER TABLE attachment_refs ADD COLUMN left_at bigint;
