-- Issue 38, item 2: budgets that renew. An authorization may carry a periodic cap beside its
-- total and per-request caps: `period` ('day', 'week' or 'month', UTC calendar periods; '' none)
-- and `period_cap` (credits per period; 0 none), signed by the payer in AuthorizeKey
-- (docs/decisions/authority-and-signing.md "Credit caps"). Rows stored before this migration
-- read as having none (their proof is a signature of the AuthorizeKey without these fields).
--
-- * authorization_ledgers gains the current period's ledger: period_start (Unix seconds, the
--   start of the period its requests count against; 0 before its first), period_reserved (the
--   maxima of the open requests admitted in that period) and period_used (the charges of the
--   closed ones), never above period_cap. A request admitted in a newer period starts them over
--   in the same conditional UPDATE that admits it (gw_reserve). A ledger row may now exist for
--   a periodic cap alone: total_cap 0 means no total cap.
-- * inference_requests.authorization_period_start: the period a periodically capped request
--   counts against (NULL otherwise), so that its close charges that period only. Not indexed,
--   written by the INSERT that admits the request: the close stays a HOT update.
ALTER TABLE permit_authorizations
  ADD COLUMN period text NOT NULL DEFAULT '' CHECK (period IN ('', 'day', 'week', 'month')),
  ADD COLUMN period_cap numeric(78, 0) NOT NULL DEFAULT 0 CHECK (period_cap >= 0),
  ADD CONSTRAINT permit_authorizations_period_both CHECK ((period = '') = (period_cap = 0));

ALTER TABLE inference_requests ADD COLUMN authorization_period_start bigint;

ALTER TABLE authorization_ledgers
  DROP CONSTRAINT authorization_ledgers_total_cap_check,
  DROP CONSTRAINT authorization_ledgers_check,
  ADD COLUMN period text NOT NULL DEFAULT '',
  ADD COLUMN period_cap numeric(78, 0) NOT NULL DEFAULT 0 CHECK (period_cap >= 0),
  ADD COLUMN period_start bigint NOT NULL DEFAULT 0,
  ADD COLUMN period_reserved numeric(78, 0) NOT NULL DEFAULT 0 CHECK (period_reserved >= 0),
  ADD COLUMN period_used numeric(78, 0) NOT NULL DEFAULT 0 CHECK (period_used >= 0),
  ADD CONSTRAINT authorization_ledgers_some_cap CHECK (total_cap >= 0 AND (total_cap > 0 OR period_cap > 0)),
  -- What the admissions keep; a bug that would break it fails instead of drifting.
  ADD CONSTRAINT authorization_ledgers_total CHECK (total_cap = 0 OR reserved + used <= total_cap),
  ADD CONSTRAINT authorization_ledgers_period
    CHECK (period_cap = 0 OR period_reserved + period_used <= period_cap);
