import type { Hex } from "viem";
import { upstreamBody, type ChatRequest } from "./request/index.js";
import { GatewayError } from "../errors.js";
import { cooldownSeconds, coolingDown } from "../reputation/cooldowns.js";
import type { InferenceDeps, UpstreamChatOptions, UpstreamReply } from "./ports.js";
import type { Candidate } from "./routing.js";
import type { Admission } from "./admission.js";
import type { CallState } from "./call-state.js";

/** What one call to a provider came to: its reply, or why another offer may (not) serve. */
export type Attempt =
  | { reply: UpstreamReply }
  | {
      failure: GatewayError;
      retryable: boolean;
      providerFault: boolean;
      /** Seconds the provider asked not to be called (429, 503 with Retry-After), bounded. */
      cooldownSeconds?: number | undefined;
    };

/**
 * One call to an offer's provider, up to its response headers. A connection failure, a 5xx or
 * a 429 is `retryable` (another offer may serve); another 4xx is the provider refusing this
 * request, which no other offer would answer differently. `providerFault`: the provider failed
 * (no answer, or a 5xx), which counts against its reputation; a 4xx (the client's own input, or a
 * 429 any client can provoke by flooding) and a failure before the provider was called do not.
 * A 429, or a 503 with `Retry-After`, carries the cooldown it asked for (`cooldownSeconds`, within
 * the bounds): the caller takes the offer out of routing, and counts it against the offer only
 * when it repeats (reputation/cooldowns.ts).
 *
 * The body carries the output limit priced for this offer (the candidate's `outputLimit`; see
 * {@link upstreamBody}), and a non-streamed call is given the time its output bound takes
 * ({@link UpstreamChatOptions.answerOutputTokens}).
 */
export async function callProvider(
  deps: Pick<InferenceDeps, "endpoints" | "upstream" | "cooldownBounds">,
  candidate: Pick<Candidate, "outputLimit" | "maxOutputTokens"> & {
    readonly offer: { readonly offerId: Hex };
  },
  req: ChatRequest,
  signal: AbortSignal,
): Promise<Attempt> {
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
  const failure = new GatewayError("upstream_error", `the provider answered HTTP ${reply.status}`);
  const cooldown =
    deps.cooldownBounds === undefined
      ? undefined
      : cooldownSeconds(reply.status, reply.retryAfter, Date.now(), deps.cooldownBounds);
  if (cooldown !== undefined) {
    // Counted against the offer by the caller only when it repeats.
    return { failure, retryable: true, providerFault: false, cooldownSeconds: cooldown };
  }
  return {
    failure,
    retryable: reply.status >= 500 || reply.status === 429,
    providerFault: reply.status >= 500,
  };
}

/**
 * The provider asked for rest (`attempt.cooldownSeconds`): its offer is out of routing for that
 * long in every process, a repeat counts against it, and the failure is `offer_cooling_down`
 * (what a request with no other offer is answered, with its Retry-After).
 */
function cooledDown(state: CallState, seconds: number): GatewayError {
  const { offer } = state.current;
  const { repeated } = state.deps.cooldowns?.cool(offer.offerId, seconds) ?? { repeated: false };
  state.observer?.cooledDown?.(offer.modelId, offer.offerId, seconds);
  if (repeated) state.providerFailed();
  return coolingDown([offer.offerId], seconds * 1000);
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
    const cooling =
      attempt.cooldownSeconds === undefined
        ? undefined
        : cooledDown(state, attempt.cooldownSeconds);
    const { failure } = attempt;
    const cools = deps.cooldowns;
    // Not to an offer that cooled down since the request was routed.
    const next = admission.candidates.find(
      (c) => !tried.has(c.offer.offerId) && cools?.remainingMs(c.offer.offerId) === undefined,
    );
    if (next === undefined) {
      // A pinned request, or no offer left: the provider's own ask, with its Retry-After.
      if (cooling !== undefined) throw cooling;
      throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
    }
    const switched = await deps.ledger.switchOffer({
      requestId: admission.requestId,
      offerId: next.offer.offerId,
      maximumCredits: next.maximumCredits,
      tariffVersion: next.offer.tariff.version,
      maxConcurrency: next.offer.maxConcurrency,
      deposit: admission.permit.deposit,
      chainSettled: admission.permit.settled,
    });
    if (!switched) {
      if (cooling !== undefined) throw cooling;
      throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
    }
    state.current = next;
    state.maximumCredits = next.maximumCredits;
  }
}
