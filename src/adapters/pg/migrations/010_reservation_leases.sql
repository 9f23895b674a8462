-- Reservation leases (issue 11; docs/proposals/reservation-leases.md, docs/decisions/chat-quotes-and-money.md
-- "Reservation leases"). A gateway process takes credits of a permit and slots of an offer in
-- bulk, admits requests against them in memory, and writes each request's record and close
-- in batches: no row that every request of a permit or offer shares is written per request.
--
-- Invariants, unchanged: a lease counts among the open reservations.
-- - permit_ledgers.reserved = the open per-request reservations + the credits of every lease
--   on the permit; so settled + unsettled charges + reservations + leases <= deposit.
-- - offer_loads.in_flight = the open per-request slots + the slots of every lease on the offer;
--   so in-flight requests + leased slots <= max_concurrency.
-- A leased request (inference_requests.leased) holds nothing of its own in those two rows: its
-- maximum and its slot are inside its holder's leases. Its close moves its charge out of the
-- lease into `charged` (reserved and the lease both shrink by the charge).
--
-- The holder of a lease is a lease epoch of a gateway process: a row of gateway_instances that
-- the process heartbeats while it admits against those leases. A process that cannot heartbeat
-- for long enough stops admitting against its epoch before any other process may take it for
-- dead, and starts a new one; the orphan rule releases the leases of a dead holder
-- (gw_release_holder) on the database's clock, and voids its open requests (gw_close_request,
-- which for a leased request charges nothing and touches no ledger row).
--
-- Lock order, extending 005/006's (quote, request, offer_loads, permit_ledgers): every function
-- here locks offer_loads and permit_ledgers rows (each class in ascending key order) before the
-- lease rows of the same call, and request rows before all of them.

CREATE TABLE permit_leases (
  holder text NOT NULL,
  permit_id text NOT NULL,
  credits numeric(78, 0) NOT NULL CHECK (credits >= 0),
  PRIMARY KEY (holder, permit_id)
);

CREATE TABLE offer_leases (
  holder text NOT NULL,
  offer_id text NOT NULL,
  slots integer NOT NULL CHECK (slots >= 0),
  PRIMARY KEY (holder, offer_id)
);

ALTER TABLE inference_requests ADD COLUMN leased boolean NOT NULL DEFAULT false;

-- The other holders' leases of a permit or an offer (a refusal's second look).
CREATE INDEX permit_leases_permit ON permit_leases (permit_id);
CREATE INDEX offer_leases_offer ON offer_leases (offer_id);

-- The functions this migration defined live in ../functions/ (current definitions only), which
-- migrate() re-applies after the migrations on every start: a migration holds tables, indexes
-- and data changes.
