import type { ChatMessage, ChatRequest } from "./request.js";
import { isObject } from "./json.js";

/**
 * The numbers a quote is made of for a chat request (request.ts): its output limit and bound,
 * and the upper bound of its prompt's tokens (its fingerprint is the request's own field).
 */

/** The output limit when neither the request nor the offer's capabilities give one. */
export const defaultOutputLimit = 4096n;

/**
 * The most output tokens the request may produce: `max_completion_tokens`, else `max_tokens`,
 * else the offer's `capabilities.max_output_tokens` (a positive integer), else
 * {@link defaultOutputLimit}.
 */
export function outputLimit(req: ChatRequest, offerCapabilities: Record<string, unknown>): bigint {
  const requested = req.maxCompletionTokens ?? req.maxTokens;
  if (requested !== undefined) return requested;
  const capability = offerCapabilities["max_output_tokens"];
  if (typeof capability === "number" && Number.isSafeInteger(capability) && capability > 0) {
    return BigInt(capability);
  }
  return defaultOutputLimit;
}

/**
 * The most output tokens the request may be billed for: {@link outputLimit} for each of its
 * `n` choices (a provider that honours `n` generates up to the limit for every choice, and
 * reports all of them as completion tokens). The quote's `max_output_tokens` and
 * `maximum_credits`, and the reservation, use it.
 */
export function outputBound(req: ChatRequest, offerCapabilities: Record<string, unknown>): bigint {
  return outputLimit(req, offerCapabilities) * req.choices;
}

/** Tokens allowed per message for the chat template's role markers and separators. */
export const perMessageTokenAllowance = 8n;
/**
 * Tokens allowed once per request for the template's constant text: begin-of-sequence and
 * generation-prompt markers, a default system prompt (Qwen2.5's is about 20 tokens), a date
 * header (Llama 3.1's is about 25), tool-use instructions (about 60 to 100 tokens).
 */
export const fixedTokenAllowance = 256n;
/**
 * Tokens allowed per non-text content part (image, audio, file...), whose tokens do not follow
 * from the bytes that reference them: `16384` is the most a Qwen2-VL image can take with its
 * default `max_pixels`, and above OpenAI's largest high-detail image.
 */
export const mediaPartTokenAllowance = 16_384n;

const textPartTypes = new Set(["text", "input_text", "output_text", "refusal"]);

function utf8Length(text: string): bigint {
  return BigInt(Buffer.byteLength(text, "utf8"));
}

/** Non-text content parts (images, audio, files) of the messages. */
export function mediaParts(messages: readonly ChatMessage[]): bigint {
  let count = 0n;
  for (const message of messages) {
    if (!Array.isArray(message.content)) continue;
    for (const part of message.content) {
      if (isObject(part) && typeof part["type"] === "string" && !textPartTypes.has(part["type"])) {
        count += 1n;
      }
    }
  }
  return count;
}

/**
 * The gateway's upper bound of the prompt's tokens, made without the model's tokenizer:
 *
 *     B(messages) + 2 * (B(tools) + B(tool_choice) + B(response_format))
 *       + 8 * (number of messages) + 16384 * (non-text content parts) + 256
 *
 * where `B(x)` is the UTF-8 byte length of `x`'s compact JSON serialisation (0 when absent).
 *
 * Why it holds: the tokenizers chat models use (byte-level BPE as in GPT, Llama 3 and Qwen;
 * SentencePiece with byte fallback as in Llama 2 and Mistral) never produce a token that covers
 * less than one byte of the text, so a text of `n` UTF-8 bytes has at most `n` tokens. A chat
 * template copies each message's text into the prompt; the JSON serialisation contains that
 * text with at least as many bytes (quotes, escapes and the keys such as `"role":"user"` only
 * add bytes), so `B(messages)` bounds the tokens of all message text. What the template adds
 * around each message (role markers, separators, end-of-turn tokens) is at most
 * {@link perMessageTokenAllowance} tokens beyond the bytes the message's JSON keys already
 * count, and its constant text (begin markers, default system prompt, date header, tool
 * instructions, generation prompt) is {@link fixedTokenAllowance}. Tool schemas, the tool
 * choice and the response format count twice, because templates often re-serialise them
 * indented (Llama 3.1 uses `tojson(indent=4)`), which adds whitespace per line the compact form
 * does not have. Images, audio and files are tokenised from their content, not from the bytes
 * that reference them, so each non-text content part adds {@link mediaPartTokenAllowance}.
 *
 * The byte argument is exact; the allowances are generous estimates of template text. Where a
 * provider still reports more, the charge is capped at the quote's maximum and the offer flagged.
 */
export function inputTokenUpperBound(req: ChatRequest): bigint {
  // Canonical JSON has exactly the length of the compact serialisation.
  const parts = req.canonical;
  const schemas = [parts.tools, parts.toolChoice, parts.responseFormat].reduce<bigint>(
    (sum, text) => sum + (text === undefined ? 0n : utf8Length(text)),
    0n,
  );
  return (
    utf8Length(parts.messages) +
    2n * schemas +
    perMessageTokenAllowance * BigInt(req.messages.length) +
    mediaPartTokenAllowance * mediaParts(req.messages) +
    fixedTokenAllowance
  );
}
