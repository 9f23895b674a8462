-- Audits (issue 39; DESIGN.md section 12; src/domain/audits/): what the blind audit traffic
-- received, and what it spent.
--
-- audit_samples: one row per answer of an offer to an audit prompt, only what the statistics
-- read (src/domain/audits/types.ts `AuditSample`): which test and prompt, the first characters
-- of the visible text (Model Equality Testing reads the first 100), or a mean log-probability.
-- Read per model since a time (the periodic evaluation: every offer of the model, the anchor's
-- included), by audit_samples_model_at. `request_id` is the audit's request (its charge is in
-- inference_requests, on the operator's audit permit), kept to join the two.
CREATE TABLE audit_samples (
  id bigserial PRIMARY KEY,
  model_id text NOT NULL,
  offer_id text NOT NULL,
  test text NOT NULL CHECK (test IN ('border_probe', 'mmd', 'logprob')),
  prompt_id text NOT NULL,
  text text,
  mean_logprob double precision,
  at_ms bigint NOT NULL,
  request_id text
);
CREATE INDEX audit_samples_model_at ON audit_samples (model_id, at_ms);

-- audit_spend: the audits' daily budget (src/domain/audits/budget.ts), one line per UTC day and
-- offer, and one per day and model. An audit reserves its quote's maximum on both lines before
-- it is sent, in one transaction whose update re-checks each line against its budget under the
-- row's lock (so concurrent audits of every process never pass it), and settles with its real
-- charge after. Only audits write here (at most a few hundred a day per offer): no client
-- request touches these rows.
CREATE TABLE audit_spend (
  day date NOT NULL,
  scope text NOT NULL CHECK (scope IN ('offer', 'model')),
  id text NOT NULL,
  model_id text NOT NULL,
  spent numeric(78, 0) NOT NULL DEFAULT 0 CHECK (spent >= 0),
  reserved numeric(78, 0) NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  requests integer NOT NULL DEFAULT 0,
  PRIMARY KEY (day, scope, id)
);
