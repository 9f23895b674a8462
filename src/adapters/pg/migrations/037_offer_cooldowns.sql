-- Offers cooling down (issue 38, item 5; docs/decisions/providers-and-routing.md "Cooldowns: a
-- provider's 429"): a provider that answered 429 (or 503 with Retry-After) is not called again,
-- by any process, until `until_ms` (Unix milliseconds of the clock of the process that saw the
-- answer). One row per offer ever cooled, upserted by the process that saw the answer (a
-- cooldown that ends sooner than the stored one changes nothing) and read by every process on a
-- short round. `started_ms`: when the cooldown began, so that a 429 shortly after it ended is
-- judged a repeat (the one that counts against the offer's reputation).
--
-- Nothing here depends on vacuum: the table holds one row per offer, and an update changes no
-- indexed column, so it is a HOT update whose old version the page pruning of a later access
-- reclaims; fillfactor leaves every page the room for it.
CREATE TABLE offer_cooldowns (
  offer_id text PRIMARY KEY,
  started_ms bigint NOT NULL,
  until_ms bigint NOT NULL
) WITH (fillfactor = 50);
