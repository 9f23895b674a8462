import type { Hex } from "viem";
import { upstreamBody, type ChatRequest } from "./request/index.js";
import { GatewayError } from "../errors.js";
import type { InferenceDeps, UpstreamChatOptions, UpstreamReply } from "./ports.js";
import type { Candidate } from "./routing.js";
import type { Admission } from "./admission.js";
import type { CallState } from "./call-state.js";

/**
 * One call to an offer's provider, up to its response headers. A connection failure or a
 * 5xx is `retryable` (another offer may serve); a 4xx is the provider refusing this request,
 * which no other offer would answer differently. `providerFault`: the provider failed (no
 * answer, or a 5xx), which counts against its reputation; a 4xx (the client's own input, or a
 * 429 any client can provoke by flooding) and a failure before the provider was called do not.
 *
 * The body carries the output limit priced for this offer (the candidate's `outputLimit`; see
 * {@link upstreamBody}), and a non-streamed call is given the time its output bound takes
 * ({@link UpstreamChatOptions.answerOutputTokens}).
 */
export async function callProvider(
  deps: Pick<InferenceDeps, "endpoints" | "upstream">,
  candidate: Pick<Candidate, "outputLimit" | "maxOutputTokens"> & {
    readonly offer: { readonly offerId: Hex };
  },
  req: ChatRequest,
  signal: AbortSignal,
): Promise<
  { reply: UpstreamReply } | { failure: GatewayError; retryable: boolean; providerFault: boolean }
> {
  const { offer, outputLimit, maxOutputTokens } = candidate;
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
  const options: UpstreamChatOptions = req.stream
    ? { signal }
    : { signal, answerOutputTokens: maxOutputTokens };
  let reply: UpstreamReply;
  try {
    reply = await deps.upstream(endpoint, upstreamBody(req, outputLimit), options);
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

/**
 * The offers' calls in turn until one answers (failover before the first byte): each failure
 * that another offer may serve moves the reservation to the next candidate (`switchOffer`),
 * and `state.current` follows. `signal` aborts the provider's call (the client left, the
 * consumer stopped).
 */
export async function dispatch(
  state: CallState,
  admission: Admission,
  signal: AbortSignal,
): Promise<UpstreamReply> {
  const { deps, observer } = state;
  const { input } = admission;
  const tried = new Set<Hex>();
  for (;;) {
    tried.add(state.current.offer.offerId);
    if (input.signal.aborted) throw input.signal.reason;
    state.calledAt = performance.now();
    if (!state.dispatched) observer?.overhead((state.calledAt - admission.arrivedAt) / 1000);
    state.dispatched = true;
    admission.trace?.step("upstream");
    const attempt = await callProvider(deps, state.current, admission.req, signal);
    if (input.signal.aborted) throw input.signal.reason;
    if ("reply" in attempt) {
      state.repliedAt = state.calledAt;
      return attempt.reply;
    }
    // Counted also when the request then fails over: the failure was this offer's.
    if (attempt.providerFault) state.providerFailed();
    if (!attempt.retryable) throw attempt.failure;
    const { failure } = attempt;
    const next = admission.candidates.find((c) => !tried.has(c.offer.offerId));
    if (next === undefined)
      throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
    const switched = await deps.ledger.switchOffer({
      requestId: admission.requestId,
      offerId: next.offer.offerId,
      maximumCredits: next.maximumCredits,
      tariffVersion: next.offer.tariff.version,
      maxConcurrency: next.offer.maxConcurrency,
      deposit: admission.permit.deposit,
      chainSettled: admission.permit.settled,
    });
    if (!switched)
      throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
    state.current = next;
    state.maximumCredits = next.maximumCredits;
  }
}
