-- Idempotency leases (issue 10, defect 7): an in_progress claim names the gateway process that
-- holds it, so the orphan rule can release the claims of a process that died instead of
-- answering 409 idempotency_in_progress for the key's 24 hours. Rows claimed before this
-- migration keep NULL and are never released early (they expire as before).
ALTER TABLE idempotency_keys ADD COLUMN instance_id text;

-- The orphan rule's scan: the in_progress claims, by holder.
CREATE INDEX idempotency_keys_in_progress ON idempotency_keys (instance_id, created_at)
  WHERE state = 'in_progress';
