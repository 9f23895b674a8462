import type { Hex } from "viem";
import { outputLimit, upstreamBody, type ChatRequest } from "../chat-request.js";
import { GatewayError } from "../errors.js";
import type { InferenceDeps, UpstreamChatOptions, UpstreamReply } from "./ports.js";

/**
 * One call to an offer's provider, up to its response headers. A connection failure or a
 * 5xx is `retryable` (another offer may serve); a 4xx is the provider refusing this request,
 * which no other offer would answer differently. `providerFault`: the provider failed (no
 * answer, or a 5xx), which counts against its reputation; a 4xx (the client's own input, or a
 * 429 any client can provoke by flooding) and a failure before the provider was called do not.
 *
 * The body carries the output limit priced for this offer ({@link outputLimit} with its
 * capabilities; see {@link upstreamBody}), and a non-streamed call is given the time that
 * output takes ({@link UpstreamChatOptions.answerOutputTokens}).
 */
export async function callProvider(
  deps: Pick<InferenceDeps, "endpoints" | "upstream">,
  offer: { readonly offerId: Hex; readonly capabilities: Record<string, unknown> },
  req: ChatRequest,
  signal: AbortSignal,
): Promise<
  { reply: UpstreamReply } | { failure: GatewayError; retryable: boolean; providerFault: boolean }
> {
  let endpoint: Awaited<ReturnType<typeof deps.endpoints>>;
  try {
    endpoint = await deps.endpoints(offer.offerId);
  } catch (error) {
    // The endpoint could not be read (the database): no provider is called; 503, not 500.
    const failure =
      error instanceof GatewayError
        ? error
        : new GatewayError("database_unavailable", "the offer's endpoint could not be read", {
            cause: error,
          });
    return { failure, retryable: false, providerFault: false };
  }
  if (endpoint === undefined) {
    return {
      failure: new GatewayError("upstream_unavailable", "the offer has no registered endpoint"),
      retryable: true,
      providerFault: false,
    };
  }
  const limit = outputLimit(req, offer.capabilities);
  const options: UpstreamChatOptions = req.stream
    ? { signal }
    : { signal, answerOutputTokens: limit * req.choices };
  let reply: UpstreamReply;
  try {
    reply = await deps.upstream(endpoint, upstreamBody(req, limit), options);
  } catch (error) {
    const failure =
      error instanceof GatewayError
        ? error
        : new GatewayError("upstream_unavailable", "the provider could not be reached");
    // A call the client's cancel aborted is the client's doing: the caller checks that first.
    return { failure, retryable: true, providerFault: true };
  }
  if (reply.status >= 200 && reply.status < 300) return { reply };
  await reply.discard();
  return {
    failure: new GatewayError("upstream_error", `the provider answered HTTP ${reply.status}`),
    retryable: reply.status >= 500,
    providerFault: reply.status >= 500,
  };
}
