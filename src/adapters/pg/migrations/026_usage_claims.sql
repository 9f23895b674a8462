-- Issue 27, item 4: both numbers kept. The gateway meters, providers claim (DESIGN.md section
-- 10): a request's charged usage (input_tokens, output_tokens, cached_input_tokens,
-- reasoning_tokens, usage_source) is the lower of the provider's claim and the gateway's own count
-- plus a tolerance; the record keeps both figures beside it, so a payer (the record, its signed
-- receipt, `gateway permit audit`) and an operator can see what was claimed and what was counted.
--
-- claimed_*: the provider's usage claim; NULL when it reported none (and for every row closed
-- before this migration). counted_*: the gateway's own count of the answer; NULL when nothing was
-- counted (nothing reached the client: a void close, an orphan). Each group is written whole or
-- not at all. Nullable, no default: no table rewrite.
--
-- They are written by the statements that close a request, in the same UPDATE (or INSERT) as the
-- rest of its final state (no extra write per request): gw_close_request (two trailing jsonb
-- parameters, default NULL, so gw_void_reservation, the orphan rule and a gateway of the previous
-- release call it unchanged), gw_close_batch and gw_close_leased_batch (two optional members of
-- an item, `claimed` and `counted`: `{input_tokens, output_tokens, cached_input_tokens,
-- reasoning_tokens}` as decimal strings; absent or null: NULL). The functions live in
-- ../functions/.
ALTER TABLE inference_requests
  ADD COLUMN claimed_input_tokens numeric(78, 0),
  ADD COLUMN claimed_output_tokens numeric(78, 0),
  ADD COLUMN claimed_cached_input_tokens numeric(78, 0),
  ADD COLUMN claimed_reasoning_tokens numeric(78, 0),
  ADD COLUMN counted_input_tokens numeric(78, 0),
  ADD COLUMN counted_output_tokens numeric(78, 0),
  ADD COLUMN counted_cached_input_tokens numeric(78, 0),
  ADD COLUMN counted_reasoning_tokens numeric(78, 0);
