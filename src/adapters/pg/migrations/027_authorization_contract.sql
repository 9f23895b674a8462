-- Issue 28: spending authority, round two. What a payer's AuthorizeKey signature says grows:
--
-- * deployment: the gateway deployment the signature is for. One id per database, made here
--   once and published at GET /v1/gateway; a signature made for another deployment (another
--   database serving the same market) is refused (`wrong_deployment`), not replayed into it.
-- * issued_at: when the gateway issued the challenge (Unix seconds, in the typed data). A
--   payer's "revoke everything signed before now" (a per-payer epoch, migration 028) refuses
--   every authorization issued at or before it, stored or still unsubmitted.
-- * total_cap / per_request_cap: the credits (the permit's smallest unit) the key may spend in
--   all and per request; 0: no cap. A cap needs one permit (its token is the cap's unit).
--
-- Rows made before this migration were signed without these fields: issued_at is their
-- created_at, their caps none, their deployment this one's.
CREATE TABLE gateway_deployment (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  id text NOT NULL
);
INSERT INTO gateway_deployment (id)
  VALUES ('dep_' || replace(gen_random_uuid()::text, '-', ''));

ALTER TABLE permit_authorizations
  ADD COLUMN issued_at bigint,
  ADD COLUMN total_cap numeric(78, 0) NOT NULL DEFAULT 0 CHECK (total_cap >= 0),
  ADD COLUMN per_request_cap numeric(78, 0) NOT NULL DEFAULT 0 CHECK (per_request_cap >= 0);
UPDATE permit_authorizations SET issued_at = created_at;
ALTER TABLE permit_authorizations ALTER COLUMN issued_at SET NOT NULL;
