-- The wake fee is charged only when the gateway itself saw the endpoint asleep, at most once per
-- offer per wake window (issue 27, item 10; docs/decisions/chat-quotes-and-money.md "Wake fees"). A request to an
-- endpoint the prober last saw down claims the fee on the endpoint's row with one conditional
-- UPDATE, so of every gateway sharing this database one request per window is charged it.
-- Unix seconds of the gateway's clock; NULL: never charged. A re-registration keeps it (a new
-- endpoint must not open a new window).
ALTER TABLE provider_endpoints ADD COLUMN wake_charged_at bigint;
