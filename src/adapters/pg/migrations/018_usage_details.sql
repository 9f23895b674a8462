-- Issue 20, item 5: usage details. Of a request's usage as the provider reported it, the input
-- tokens served from the provider's prompt cache (OpenAI's
-- `usage.prompt_tokens_details.cached_tokens`) and the output tokens spent on reasoning
-- (`usage.completion_tokens_details.reasoning_tokens`) are recorded with the request. They are
-- parts of input_tokens and output_tokens, shown and never priced: the charge stays the price
-- of input_tokens and output_tokens (DESIGN.md section 3). The gateway records them only when
-- credible (non-negative, within the totals), else 0; 0 also when the provider reported none,
-- for every close but a completed one with provider usage, and for every row closed before this
-- migration (a constant default: no table rewrite).
--
-- They are written by the statements that close a request, in the same UPDATE (or INSERT) as
-- the rest of its final state, so a close costs no extra write: gw_close_request (two new
-- trailing parameters, default 0, so gw_void_reservation, the orphan rule and a gateway of the
-- previous release call it unchanged), gw_close_batch and gw_close_leased_batch (two new
-- optional members of an item; absent: 0). Otherwise the functions are their latest
-- definitions (010's gw_close_request, 006's gw_close_batch, 016's gw_close_leased_batch).
ALTER TABLE inference_requests
  ADD COLUMN cached_input_tokens numeric(78, 0) NOT NULL DEFAULT 0,
  ADD COLUMN reasoning_tokens numeric(78, 0) NOT NULL DEFAULT 0;

-- The functions this migration defined live in ../functions/ (current definitions only), which
-- migrate() re-applies after the migrations on every start: a migration holds tables, indexes
-- and data changes.
