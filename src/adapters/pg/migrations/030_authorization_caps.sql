-- Issue 28, item 7: narrowed delegation. An authorization's credit caps (migration 027:
-- permit_authorizations.total_cap, per_request_cap) are enforced, and every request records the
-- authorization that admitted it (docs/decisions/authority-and-signing.md "Spending authority", "Credit caps").
--
-- * inference_requests.authorization_id: the authorization that admitted the request, written
--   by the statement that reserves it (gw_reserve, or a leased record's insert); NULL for
--   requests made before this migration and for the void rows gw_void_reservation inserts.
--   authorization_capped: the request holds its maximum against the authorization's total cap
--   (authorization_ledgers.reserved) until its close moves the charge to `used`.
-- * authorization_ledgers: one row per authorization with a total cap that ever admitted a
--   request (made by its first reservation, as permit_ledgers rows are), the cap's deposit-like
--   ledger: reserved (the maxima of its open requests) and used (the charges of its closed
--   ones), never above the cap. Its own table, not columns of permit_authorizations: rows of
--   that table are what the key lookup reads and what the authority signals announce on every
--   write (migration 029), and a capped request writes its ledger row twice. No column of it is
--   indexed and fillfactor leaves room on each page, so those updates are HOT.
ALTER TABLE inference_requests
  ADD COLUMN authorization_id text,
  ADD COLUMN authorization_capped boolean NOT NULL DEFAULT false;

-- An authorization's use: its last request, and the charges of an uncapped one, read by its id.
CREATE INDEX inference_requests_authorization ON inference_requests (authorization_id, created_at)
  WHERE authorization_id IS NOT NULL;

CREATE TABLE authorization_ledgers (
  authorization_id text PRIMARY KEY REFERENCES permit_authorizations (id),
  -- The authorization's total_cap, copied: the admission's conditional UPDATE reads this row only.
  total_cap numeric(78, 0) NOT NULL CHECK (total_cap > 0),
  reserved numeric(78, 0) NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  used numeric(78, 0) NOT NULL DEFAULT 0 CHECK (used >= 0),
  -- What the admissions keep; a bug that would break it fails instead of drifting.
  CHECK (reserved + used <= total_cap)
) WITH (fillfactor = 50);
