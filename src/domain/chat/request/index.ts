/**
 * The chat request, the face of its folder: what code outside the folder imports. The request
 * and its parsing (request.ts), its JSON reading and bounds (json.ts), the numbers a quote is
 * made of (quote.ts) and the bytes that go upstream (upstream.ts).
 */
export {
  maxChoices,
  parseChatRequest,
  type ChatMessage,
  type ChatRequest,
  type ChatRole,
  type JsonObject,
} from "./request.js";
export {
  canonicalJson,
  checkJsonBounds,
  maxJsonArrayItems,
  maxJsonDepth,
  parseJsonText,
  type JsonBounds,
} from "./json.js";
export {
  defaultOutputLimit,
  fixedTokenAllowance,
  inputTokenUpperBound,
  mediaPartTokenAllowance,
  mediaParts,
  outputBound,
  outputLimit,
  perMessageTokenAllowance,
} from "./quote.js";
export { upstreamBody } from "./upstream.js";
