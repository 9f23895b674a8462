-- Issue 28, item 2: the payer in control without the key (docs/decisions/authority-and-signing.md "Spending
-- authority"). With its own signature a payer lists every authorization made for its address and
-- revokes them by key, by permit or all; "all" also raises the payer's epoch.
--
-- payer_epochs: per payer (lower-case address), the Unix second at or before which every
-- AuthorizeKey it signed is void, stored or not yet submitted; only ever raised (0: none yet).
--
-- * Storing an authorization first makes sure its payer has a row, then reads the epoch FOR
--   SHARE in the statement that inserts it and inserts nothing when issuedAt <= epoch
--   (`authorization_revoked`). A "revoke all" raises the epoch (locking the row) and then, in the
--   same transaction and a later statement, marks revoked every authorization of the payer
--   issued at or before it. Whichever takes the row first, an authorization issued at or before
--   the epoch is either refused or marked revoked: none survives unmarked, so the rows' own
--   signals (migration 029, per API key) tell every gateway process which keys lost authority.
-- * The API key lookup (findApiKeyWithAuthorizations) also leaves out an authorization issued at
--   or before its payer's epoch, whatever wrote it.
--
-- The epoch itself sends no signal: a signature over RevokeAuthorizations costs nothing to make
-- for a fresh address, so an `all` signal per epoch raised would let anyone empty every
-- process's key cache as often as it likes.
CREATE TABLE payer_epochs (
  payer text PRIMARY KEY,
  epoch bigint NOT NULL CHECK (epoch >= 0),
  -- Unix seconds: when the epoch was last raised (0: never).
  updated_at bigint NOT NULL
);

-- A payer's listing (newest first) and its revocations read its rows by payer.
CREATE INDEX permit_authorizations_payer ON permit_authorizations (payer, seq);
