import { fromCompletion, errorBody } from "./responses-answer.js";
import { toCanonical } from "./responses-request.js";
import { createReader } from "./responses-reader.js";
import { createStream } from "./responses-stream.js";
import type { Dialect } from "./types.js";

/*
 * The dialect's parts, by job: the request (responses-request.ts), the JSON answer and error body
 * (responses-answer.ts), the bounded stream translator (responses-stream.ts).
 */

/**
 * The OpenAI Responses API (`POST /v1/responses`) as a dialect of the canonical chat completion
 * (DESIGN.md section 9): request in, answer and events out. Pure: no I/O, and no clock except
 * when the provider's answer carries no `created` time.
 *
 * The gateway is stateless, so everything the Responses API keeps on the server is refused with
 * a message naming the field: `previous_response_id`, `conversation`, `prompt` (stored
 * templates), `background: true`, input `item_reference`s and `file_id`s. `store: true` is
 * refused too: a client that asks for its response to be kept means to use it later (by id, or
 * as `previous_response_id`), and accepting it would only defer the failure to that later call.
 * `store` absent (the official SDK sends none unless asked) or `false` is accepted: nothing is
 * stored either way.
 *
 * What the canonical request cannot express is refused rather than dropped, so a client never
 * gets a silently different answer: built-in tools (web search, file search, computer use, code
 * interpreter, MCP...), `truncation: "auto"`, `top_logprobs`, file and audio inputs, and any
 * field this module does not know. Accepted and not forwarded, because they only tune or label
 * the provider's service and change nothing in the answer the gateway relays: `metadata`,
 * `include` (it adds data to item kinds this gateway never returns), `prompt_cache_key`,
 * `prompt_cache_retention`, `safety_identifier`, `service_tier`, `stream_options`,
 * `reasoning.summary`. Input `reasoning` items are dropped: they are one provider's opaque
 * state, and chat has no place for them.
 *
 * A `developer` message becomes a `system` one (and `instructions` a first system message):
 * most providers' chat templates know no developer role. The gateway's own request fields,
 * `offer` and `provider`, are carried into the canonical request unchanged, where the gateway
 * reads them as on the chat route (and cuts them out of what goes upstream).
 *
 * The answer echoes no request parameter (the translator sees only the provider's answer):
 * `instructions`, `tools`, `temperature`, `top_p` and `metadata` are neutral (`null` or `[]`).
 *
 * What a stream holds (docs/decisions/api-and-console.md, "Client dialects"). The Responses API sends the answer
 * again at its end: `response.output_text.done` a part's whole `text`,
 * `response.content_part.done` the part, `response.function_call_arguments.done` a call's whole
 * `arguments`, `response.output_item.done` the item, and `response.completed` (`.incomplete`,
 * `.failed`) the response with every item in its `output`. The official SDK reads them: its
 * accumulator replaces a part's text, an item and at last its whole snapshot with what they carry,
 * and `finalResponse()` is the closing event's response. So a stream holds each item's text,
 * arguments, name and call id until the end, and nothing else of the answer: the usage as its
 * figures, the finish reason as the status it makes. Bounded: at most `maxHeldChars`
 * (responses-stream.ts) code units of the provider's strings and `maxHeldParts` items and content
 * parts per answer. An answer that would pass either is cut there, as the output limit cuts one:
 * what fits of that delta is relayed, nothing of the answer after it; the response ends
 * `incomplete` (`max_output_tokens`), its open message `incomplete`, a call whose arguments were
 * cut `incomplete`. The done events carry exactly what was relayed, so the deltas, the done
 * events and the SDK's final response agree. What the provider sent past the cut is still metered
 * as it came (the translator does not see the count).
 */
export const responsesDialect: Dialect = {
  name: "responses",
  toCanonical,
  fromCompletion,
  createStream,
  reader: createReader,
  errorBody,
};
