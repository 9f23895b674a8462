import type { UpstreamChat } from "../../domain/chat/ports.js";
import { flowEventData } from "./event-stream.js";
import type { UpstreamClient } from "./http.js";

/**
 * The domain's chat call to a provider ({@link UpstreamChat}, src/domain/chat/ports.ts) over the
 * upstream client, with its deadlines.
 */

/**
 * The longest a timer can run (Node's setTimeout holds a signed 32-bit millisecond count, and
 * fires at once for anything longer): ~24.8 days.
 */
export const maxTimerMs = 2_147_483_647;

/**
 * The deadline of a non-streamed chat call, headers included: the headers deadline, or the time
 * its output takes at the least speed a provider is held to, whichever is longer.
 *
 *     max(headersTimeoutMs, ceil(outputTokens × 1000 / minTokensPerSecond))   (at most maxTimerMs)
 *
 * An OpenAI-compatible server sends a JSON answer's headers only when generation ends, so the
 * headers deadline of a stream (its first byte comes at once) would cut a long JSON answer short,
 * count it as the provider's failure and fail it over to a competitor that would meet the same
 * end. `outputTokens` is what the call may produce: the priced limit of each choice times the
 * choices (bigint: a limit may exceed 2^53).
 */
export function answerDeadlineMs(opts: {
  readonly headersTimeoutMs: number;
  readonly outputTokens: bigint;
  readonly minTokensPerSecond: number;
}): number {
  const speed = BigInt(opts.minTokensPerSecond);
  if (speed <= 0n) throw new RangeError("minTokensPerSecond must be a positive integer");
  const tokens = opts.outputTokens > 0n ? opts.outputTokens : 0n;
  const generation = (tokens * 1000n + speed - 1n) / speed;
  const capped = generation > BigInt(maxTimerMs) ? maxTimerMs : Number(generation);
  return Math.min(maxTimerMs, Math.max(opts.headersTimeoutMs, capped));
}

/** The deadlines of the chat calls {@link createUpstreamChat} makes. */
export interface UpstreamChatTimeouts {
  /** A stream's deadline for the response headers (UPSTREAM_TIMEOUT_MS). */
  readonly timeoutMs: number;
  /** Longest silence between two body chunks (UPSTREAM_IDLE_TIMEOUT_MS). */
  readonly idleTimeoutMs: number;
  /** The least speed a non-streamed answer is held to (UPSTREAM_MIN_TOKENS_PER_SECOND). */
  readonly minTokensPerSecond: number;
}

/**
 * The domain's {@link UpstreamChat} port over this client: `POST /v1/chat/completions` with
 * the body as given. A stream must send its headers within `timeoutMs`; a non-streamed call
 * (`answerOutputTokens` given) has {@link answerDeadlineMs} for its headers, and as long for any
 * silence in its body, since a server may also send headers first and the JSON when it is done.
 */
export function createUpstreamChat(
  client: UpstreamClient,
  timeouts: UpstreamChatTimeouts,
): UpstreamChat {
  return async (endpoint, body, { signal, answerOutputTokens }) => {
    const deadlineMs =
      answerOutputTokens === undefined
        ? undefined
        : answerDeadlineMs({
            headersTimeoutMs: timeouts.timeoutMs,
            outputTokens: answerOutputTokens,
            minTokensPerSecond: timeouts.minTokensPerSecond,
          });
    const reply = await client.request(endpoint, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
      signal,
      timeoutMs: deadlineMs ?? timeouts.timeoutMs,
      idleTimeoutMs: Math.max(timeouts.idleTimeoutMs, deadlineMs ?? 0),
    });
    const retryAfter = reply.headers["retry-after"];
    return {
      status: reply.status,
      retryAfter: Array.isArray(retryAfter) ? retryAfter[0] : retryAfter,
      text: () => reply.text(),
      stream: (into) => flowEventData(reply, into),
      discard: () => reply.dump(),
    };
  };
}
