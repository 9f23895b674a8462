-- Offers serve the model they sell (issue 39; DESIGN.md section 12; docs/decisions/audits.md):
-- each offer's audit standing, the market's latest verdict on it (src/domain/audits/types.ts,
-- `OfferAuditVerdict`). Written by the process that judged the market (one statement for all
-- its verdicts), read whole by every process on a short round: routing reads memory only
-- (src/domain/audits/standing.ts), so every process, and every restart, agrees on which offers
-- are flagged (sorted last) and excluded (out of routing, pinned requests included).
--
-- `excluded` holds until a verification of the offer passes (adapters/pg/endpoint-health.ts, in
-- the statement that records the run): that clears the evidence (state `unaudited`, e-value 1,
-- no tests) and sets `cleared_at_ms`, before which no sample counts again. A verdict judged from
-- samples read before that clearing is not written over it (adapters/pg/audits.ts).
--
-- Numbers a statistic produced are float8 (a JS number round-trips exactly; `Infinity` too);
-- `tests` is the evidence per test as the operator sees it (AuditTestEvidence[]). Times are Unix
-- milliseconds.
--
-- Nothing here depends on vacuum: one row per offer, and an update changes no indexed column
-- (the key only), so it is a HOT update whose old version the page pruning of a later access
-- reclaims; fillfactor leaves every page the room for it.
CREATE TABLE offer_audit_standings (
  offer_id text PRIMARY KEY,
  model_id text NOT NULL,
  state text NOT NULL CHECK (state IN ('unaudited', 'passing', 'flagged', 'excluded')),
  e_value double precision NOT NULL,
  flag_at double precision NOT NULL,
  exclude_at double precision NOT NULL,
  reference_kind text NOT NULL CHECK (reference_kind IN ('anchor', 'majority', 'data')),
  reference_offer_id text,
  tests jsonb NOT NULL DEFAULT '[]'::jsonb,
  updated_at_ms bigint NOT NULL,
  cleared_at_ms bigint
) WITH (fillfactor = 50);
