-- Usage divergence (issue 27, item 5; docs/decisions/metering-and-tokens.md "Usage divergence"): an offer whose
-- usage claims run above the gateway's count beyond tolerance in too many of its answers is
-- flagged, and past a higher share leaves routing until a verification of it passes.

-- Each process's window also counts the answers that carried a usage claim and the claims that
-- diverged (src/domain/chat/measurements.ts), still one row per process and offer written every
-- few seconds. `divergence_since`: the clearing of the offer's last exclusion those two counts
-- follow (Unix seconds; 0: none), so counts from before a clearing are not merged with later ones.
ALTER TABLE offer_measurements ADD COLUMN claimed bigint NOT NULL DEFAULT 0;
ALTER TABLE offer_measurements ADD COLUMN diverged bigint NOT NULL DEFAULT 0;
ALTER TABLE offer_measurements ADD COLUMN divergence_since bigint NOT NULL DEFAULT 0;

-- An offer's exclusion from routing for diverging claims: written by the sharing round of the
-- process that saw the share pass the bound (every process reads it there, and at start), and
-- cleared only by a verification run of the offer that passed (adapters/pg/endpoint-health.ts,
-- in the statement that records the run). One row per offer ever excluded. Times are Unix
-- seconds of the gateway's clock; `claimed`/`diverged`: the window's counts that excluded it.
CREATE TABLE offer_usage_exclusions (
  offer_id text PRIMARY KEY,
  excluded_at bigint NOT NULL,
  claimed bigint NOT NULL,
  diverged bigint NOT NULL,
  cleared_at bigint
);
