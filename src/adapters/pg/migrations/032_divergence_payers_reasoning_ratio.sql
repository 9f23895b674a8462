-- Issue 35, items 8 and 9 (docs/decisions/metering-and-tokens.md, "Usage divergence" and
-- "Hidden reasoning").

-- Divergence counts only across independent payers: each process's window also keeps the
-- distinct payers (permit payer addresses, lower case, at most 16) of its diverged answers, a
-- JSON array merged as a union by every process (src/domain/chat/measurements.ts). Still one row
-- per process and offer, written every few seconds, never per request.
ALTER TABLE offer_measurements ADD COLUMN diverged_payers jsonb NOT NULL DEFAULT '[]';

-- The distinct payers of the window that excluded an offer (NULL: excluded before payers were
-- counted).
ALTER TABLE offer_usage_exclusions ADD COLUMN payers integer;

-- The hidden reasoning ratio is a priced term of the offer's tariff version: read from the
-- offer's capabilities when the indexer records a tariff version, and kept while the version
-- stands (a change of the capabilities alone changes nothing until the tariff changes, so a quote,
-- bound to the version, binds the ratio too). 0: no hidden reasoning is charged.
ALTER TABLE offers ADD COLUMN hidden_reasoning_ratio integer NOT NULL DEFAULT 0;
-- Offers indexed before this migration: the ratio their capabilities declare now, for the version
-- they stand at (the rule of src/domain/chat/usage.ts `declaredHiddenReasoningRatio`).
UPDATE offers SET hidden_reasoning_ratio = (capabilities->>'hidden_reasoning_ratio')::integer
WHERE jsonb_typeof(capabilities->'hidden_reasoning_ratio') = 'number'
  AND capabilities->>'hidden_reasoning_ratio' ~ '^[1-9][0-9]?$'
  AND (capabilities->>'hidden_reasoning_ratio')::integer <= 64;
