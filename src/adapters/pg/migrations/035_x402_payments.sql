-- Issue 37: agents pay per request with x402 `upto` (DESIGN.md section 11,
-- docs/decisions/agent-payments.md).
--
-- One row per signed payment, made when the gateway admits the request it pays for: its key,
-- (payer, nonce), is Permit2's own single-use key, so the same signature pays one request on
-- every gateway process (a second insert conflicts). The row holds what settlement submits (the
-- signed transfer) and the permit id the Market records it under (x402PermitId(owner, nonce));
-- the request's record (inference_requests, permit_id = that id) holds the charge as any
-- request's does, and settlement batches it with permit charges.
--
-- state: 'open' from admission until settlement ends it: 'settled' (the Market took it),
-- 'failed' (the chain refused it: balance or allowance moved, the signature was spent
-- elsewhere; its reason kept), 'void' (its request was charged nothing: nothing to settle).
CREATE TABLE x402_payments (
  payer text NOT NULL,
  nonce numeric(78, 0) NOT NULL,
  permit_id text NOT NULL UNIQUE,
  token text NOT NULL,
  -- What the payer signed for (the most that may move) and what the request was admitted at.
  signed_amount numeric(78, 0) NOT NULL,
  maximum numeric(78, 0) NOT NULL,
  deadline bigint NOT NULL,
  -- The signed transfer as settlement submits it: {permit, owner, witness, signature}.
  payload jsonb NOT NULL,
  state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'failed', 'void')),
  reason text,
  created_at bigint NOT NULL,
  ended_at bigint,
  PRIMARY KEY (payer, nonce)
);
-- In-flight exposure (the open payments of a payer, of a token) is summed over this index.
CREATE INDEX x402_payments_open ON x402_payments (token, payer) WHERE state = 'open';

-- Payers refused further x402 payments (a settlement of theirs failed), until an operator
-- clears them (DELETE, `gateway x402 clear <address>`). Read by every process at admission.
CREATE TABLE x402_blocked_payers (
  payer text PRIMARY KEY,
  permit_id text NOT NULL,
  reason text NOT NULL,
  blocked_at bigint NOT NULL
);
