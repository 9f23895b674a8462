-- Offer reputation (issue 22, item 4; docs/decisions/providers-and-routing.md "Offer reputation"): what the catalog
-- shows of each offer over a sliding window, and what `provider.sort` reads, from one source.

-- Each process's window of an offer replaces its moving averages (migration 019): requests the
-- provider served and failed, and histograms of time to first token and output tokens per
-- second (`[[bin, count, sum], ...]`, src/domain/chat/measurements.ts). Still one row per
-- process and offer, written every few seconds, never per request. `latency_ms` and
-- `throughput` keep the window's medians (readable by a person, not read back).
ALTER TABLE offer_measurements ADD COLUMN served bigint NOT NULL DEFAULT 0;
ALTER TABLE offer_measurements ADD COLUMN failed bigint NOT NULL DEFAULT 0;
ALTER TABLE offer_measurements ADD COLUMN latency_histogram jsonb NOT NULL DEFAULT '[]';
ALTER TABLE offer_measurements ADD COLUMN throughput_histogram jsonb NOT NULL DEFAULT '[]';

-- Every verification run's outcome (provider_endpoints keeps only the last one, migration 013):
-- the catalog's verification pass rate over the window. One row per run, and runs are bounded
-- per offer (VERIFY_MIN_INTERVAL_SECONDS, fleet-wide), so no caller can grow it faster than
-- that. Times are Unix seconds of the gateway's clock; rows older than a week are pruned.
CREATE TABLE offer_verification_runs (
  offer_id text NOT NULL,
  ran_at bigint NOT NULL,
  outcome text NOT NULL CHECK (outcome IN ('verified', 'rejected', 'unreachable'))
);
CREATE INDEX offer_verification_runs_ran_at ON offer_verification_runs (ran_at);

-- The flags of the window are counted every few seconds: by time, not by a scan of all flags.
CREATE INDEX offer_flags_created_at ON offer_flags (created_at);
