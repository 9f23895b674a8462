-- Quarantine (issue 12): a model or offer whose on-chain values the catalog cannot hold (a NUL
-- in a string, max_concurrency above int4, absurd lengths, invalid UTF-8, capabilities jsonb
-- refuses...) is stored with neutral values and the reason, instead of failing the indexer's
-- transaction for the whole range. NULL: not quarantined. The reason names the field and the
-- problem (e.g. `region_has_nul`), never the value. Catalog views leave quarantined entities out;
-- offer health shows the reason; routing never picks them.

ALTER TABLE models ADD COLUMN quarantine_reason text;
ALTER TABLE offers ADD COLUMN quarantine_reason text;
