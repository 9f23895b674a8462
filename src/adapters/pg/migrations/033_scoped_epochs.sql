-- Issue 37, item 8: a payer's revocation by key or by permit kills what was signed before it, as
-- a revoke all does (migration 028). Before this, only "all" raised an epoch: an AuthorizeKey
-- signed before `revoke --key K` and submitted after it was stored and live.
--
-- payer_scope_epochs: per payer (lower-case address) and scope, the Unix second at or before
-- which every AuthorizeKey the payer signed in that scope is void, stored or not yet submitted;
-- only ever raised. A scope is a key (`api_key_id`, '' for any), a permit (`permit_id`, the zero
-- bytes32 for any), or both; "any key, any permit" is payer_epochs' (never a row here). A scope
-- covers an authorization when its key is the authorization's (or any) and its permit is the
-- authorization's exactly (or any): a revocation of one permit does not void an authorization of
-- every permit, as the revocation itself does not mark it (docs/decisions/authority-and-signing.md).
--
-- Ordering with inserts, as for revoke all: a scoped revocation takes the payer's payer_epochs
-- row FOR UPDATE (making it when missing) before it raises its scope's epoch and marks the rows;
-- an insert takes the same row FOR SHARE in a statement of its own, then reads the scopes and
-- inserts in a later statement. Whichever goes first, an authorization issued at or before the
-- scope's epoch is refused or marked.
CREATE TABLE payer_scope_epochs (
  payer text NOT NULL,
  api_key_id text NOT NULL,
  permit_id text NOT NULL,
  epoch bigint NOT NULL CHECK (epoch >= 0),
  -- Unix seconds: when the epoch was last raised.
  updated_at bigint NOT NULL,
  PRIMARY KEY (payer, api_key_id, permit_id),
  CHECK (api_key_id <> '' OR permit_id <> '0x0000000000000000000000000000000000000000000000000000000000000000')
);

-- payer_revocations: the RevokeAuthorizations signatures applied lately (issue 37). A revocation
-- applies up to the later of its signed `before` and the gateway's clock; a replay of the same
-- signature (payer, scope, signed `before`) applies up to what the first submission did, so it
-- revokes nothing issued since. A signed `before` more than 5 minutes behind the gateway's clock
-- is refused anyway: older rows are dropped by the next revocation of the payer.
CREATE TABLE payer_revocations (
  payer text NOT NULL,
  api_key_id text NOT NULL,
  permit_id text NOT NULL,
  signed_before bigint NOT NULL,
  revoked_before bigint NOT NULL,
  PRIMARY KEY (payer, api_key_id, permit_id, signed_before)
);
