-- Issue 38, item 2: a soft threshold the payer sets. `warn_at` (credits; 0 none), signed by the
-- payer in AuthorizeKey beside the caps, is the use (the current period's with a periodic cap,
-- else the total's: charged and held, as the ledger counts it) from which the answers admitted
-- through the authorization carry a warning (x_gateway.budget_warning). Rows stored before this
-- migration read as having none (their proof is a signature of the AuthorizeKey without it).
--
-- authorization_ledgers.warned_start: the period (its start, Unix seconds; 0 for a threshold on
-- the total) in which an admission last took the use to or over the threshold, set by that one
-- admission's conditional UPDATE (adapters/pg/authorization-warnings.ts), so that exactly one
-- request per period counts as the crossing (the metric), whichever process admitted it. NULL:
-- never crossed. Written only by a request that crosses, never by every request.
ALTER TABLE permit_authorizations
  ADD COLUMN warn_at numeric(78, 0) NOT NULL DEFAULT 0 CHECK (warn_at >= 0);

ALTER TABLE authorization_ledgers ADD COLUMN warned_start bigint;
