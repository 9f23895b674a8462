import { errorBody, fromCompletion } from "./messages-answer.js";
import { toCanonical } from "./messages-request.js";
import { createReader } from "./messages-reader.js";
import { createStream } from "./messages-stream.js";
import type { Dialect } from "./types.js";

/*
 * The dialect's parts, by job: the request (messages-request.ts), the JSON answer and error body
 * (messages-answer.ts), the bounded stream translator (messages-stream.ts).
 */

/**
 * The Anthropic Messages dialect (`POST /v1/messages`, DESIGN.md section 9): a Messages request
 * becomes the canonical chat completion request, and the canonical answer (a chat.completion, or
 * its chat.completion.chunk stream) becomes a Messages answer (a `message`, or the named SSE
 * events `message_start` ... `message_stop`). Pure: no I/O, no clock, no randomness; ids derive
 * from the gateway's request id.
 *
 * Decisions where the two APIs differ (each one visible to a client, so written down here):
 * - `top_k` is dropped: chat completions has no such parameter (OpenAI refuses it, so passing it
 *   on would fail at some providers); it is a sampling hint that changes neither the answer's
 *   shape nor its price, and Anthropic itself calls it "for advanced use cases only".
 * - `thinking` is refused unless `{"type": "disabled"}`: the providers answer chat completions,
 *   which have no thinking blocks, signatures or budget; a client that asked for thinking would
 *   get none, and could not send the blocks back. Thinking blocks in assistant messages are
 *   refused for the same reason; reasoning deltas a provider streams are not relayed.
 * - `metadata` is dropped, except `metadata.user_id`, which becomes `user`; `service_tier`
 *   (Anthropic's capacity) is dropped. Other fields Anthropic knows (`container`, `mcp_servers`,
 *   `output_config`...) and unknown fields are refused, naming the field, as Anthropic does.
 * - The gateway's own request fields `offer` (pin) and `provider` (preferences) pass through to
 *   the canonical request, which validates them.
 * - `max_tokens` stays `max_tokens` on the chat request: the name more OpenAI-compatible
 *   servers know, and the gateway's quote reads either.
 * - Usage in Anthropic's sense: `input_tokens` excludes the cache reads, so `input_tokens +
 *   cache_read_input_tokens` is the provider's `prompt_tokens` (`x_gateway` keeps the gateway's
 *   own counts, as billed); reasoning tokens, when reported, become
 *   `output_tokens_details.thinking_tokens` (still counted in `output_tokens`).
 * - A streamed answer's `message_start` says `input_tokens: 0`: the count is known only from the
 *   provider's last chunk; `message_delta` carries it (the SDKs take it from there).
 * - `finish_reason` -> `stop_reason`: `length` -> `max_tokens`, `tool_calls` -> `tool_use` (also
 *   when a provider says `stop` but called tools), `content_filter` -> `refusal`, else
 *   `end_turn`; `stop_sequence` when the provider names the stop string it met (vLLM's
 *   `stop_reason` on the choice), since chat completions otherwise does not say.
 * - `tool_result` with `is_error: true` becomes a tool message whose content starts with
 *   `Error: `: chat completions has no error flag, and the model should still learn it failed.
 * - What a stream holds (docs/decisions/api-and-console.md, "Client dialects"): no text and no arguments. Nothing
 *   of the answer is sent again at its end (`content_block_stop`, `message_delta` and
 *   `message_stop` carry none; the official SDK builds the message from the deltas alone, by
 *   block index), so each delta is relayed as it comes and let go. Per tool call the stream keeps
 *   its block index, for a provider's later argument deltas to that call; a call whose name has
 *   not come keeps its id and arguments, all such calls at most `maxPendingChars`
 *   (messages-stream.ts) together (past it, the call that passed it starts its block with an
 *   empty name, as at the end). At most `maxToolCalls` calls: one more cuts the answer as the
 *   output limit does (nothing of it after is relayed; `stop_reason` is `max_tokens`). The
 *   usage is held as its figures, the finish reason as one of those that matter, the stop string
 *   as the provider named it.
 */

/** The Anthropic Messages dialect. */
export const messagesDialect: Dialect = {
  name: "messages",
  toCanonical,
  fromCompletion,
  createStream,
  reader: createReader,
  errorBody,
};
