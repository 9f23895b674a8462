-- Verification runs (issue 18, DESIGN.md section 8, "No one can knock an offer out"). A run is
-- claimed on the endpoint's row before it starts, so every gateway sharing this database runs at
-- most one verification of an offer per VERIFY_MIN_INTERVAL_SECONDS; callers inside the bound
-- are answered the last run's outcome, which is kept here. A run that failed in transport
-- (outcome `unreachable`) leaves verified_at and verification_expires_at as they were; only a
-- wrong answer (`rejected`) clears them. All times are Unix seconds of the gateway's clock.
-- Re-registration clears every column below (a new endpoint is verified at once).

-- When the last run was claimed (NULL: never).
ALTER TABLE provider_endpoints ADD COLUMN verify_claimed_at bigint;
-- When the last run ended, and how: verified | rejected | unreachable.
ALTER TABLE provider_endpoints ADD COLUMN last_verification_at bigint;
ALTER TABLE provider_endpoints ADD COLUMN last_verification_outcome text;
-- The failed check's code and its message (written not to name the endpoint: adapters/upstream/probe.ts).
ALTER TABLE provider_endpoints ADD COLUMN last_verification_check text;
ALTER TABLE provider_endpoints ADD COLUMN last_verification_message text;
