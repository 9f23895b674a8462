import type { Hex } from "viem";
import { parseChatRequest } from "./request/index.js";
import { canonicalBody, dialects, translatingSink } from "../dialects/index.js";
import { GatewayError } from "../errors.js";
import {
  fitsPerRequestCap,
  perRequestCapRefusal,
  requireAuthority,
  type PermitAuthorization,
} from "../permit-authorization/index.js";
import { checkPermit } from "../permits.js";
import { randomHex } from "../random-id.js";
import { boundCounters, type TokenCounters } from "../tokens.js";
import { serve } from "./call.js";
import type { RelayContext } from "./call-state.js";
import { admit, type ChatTurn } from "./admission.js";
import { checkIdempotencyKey, claimKey, KeptAnswer, replay, type Keeping } from "./idempotent.js";
import { createCloses } from "./lifecycle.js";
import { runPaid } from "./paid.js";
import type { ChatInput, ChatTrace, Inference, InferenceDeps } from "./ports.js";
import { boundQuote, createQuote, modelLoading, noEligibleOffer, type Quoting } from "./quotes.js";
import { fitsMaxPrice, maxPriceRefusal, rankCandidates, type Candidate } from "./routing.js";
import { ForwardingSink } from "./sink.js";
import {
  defaultIdempotencyMaxResultBytes,
  type AnswerSink,
  type ChatCompleted,
  type ChatSink,
} from "./types.js";

/**
 * The pipeline of a chat request, step by step: validate -> idempotency -> bind the quote ->
 * permit -> route -> count the prompt -> reserve, then the call (`call.ts`) and its one close (`lifecycle.ts`); the
 * Idempotency-Key's keeping and replay are in `idempotent.ts`, quotes in `quotes.ts`.
 */

/**
 * The end of a call's sink chain: hands each event to the transport's sink and notes when the
 * terminal `completed` was called (one object per call; its methods are the prototype's).
 */
class CallEnd extends ForwardingSink<ChatSink> {
  done = false;
  /**
   * The stream's admission (`acquireStream`). Released before the client's last event is handed
   * on (completed, failed or cancelled): a client that has read its whole answer may open its
   * next stream at once, while this call's close is still being recorded.
   */
  readonly stream: { release?: () => void } = {};
  override completed(event: ChatCompleted): void | Promise<void> {
    this.done = true;
    this.releaseStream();
    return this.next.completed(event);
  }
  /** Gives the stream's admission back, once. */
  releaseStream(): void {
    const { release } = this.stream;
    this.stream.release = undefined;
    release?.();
  }
}

/**
 * What every call shares: the deps and what `createInference` derives from them once (one
 * object per gateway; the call's steps below are module functions over it, so a request
 * allocates no closures of its own).
 */
interface Pipeline extends RelayContext {
  readonly newId: () => Hex;
  readonly routing: Quoting["routing"];
  readonly bounds: Quoting["bounds"];
  readonly tokens: TokenCounters;
  readonly keeping: Keeping;
  /**
   * Chat calls under way, so that drain() (shutdown) also waits for the closes of requests
   * that were cut, which are written as their calls unwind.
   */
  running: number;
  readonly whenIdle: (() => void)[];
}

export function createInference(deps: InferenceDeps): Inference {
  const newId = deps.newId ?? ((): Hex => `0x${randomHex(32)}`);
  const audits = deps.audits;
  const routing = {
    measured: (offerId: Hex) => deps.measurements?.get(offerId),
    coolingMs: (offerId: Hex) => deps.cooldowns?.remainingMs(offerId),
    audit: audits === undefined ? undefined : (offerId: Hex) => audits.stateOf(offerId),
  };
  const maxResultBytes = deps.idempotencyMaxResultBytes ?? defaultIdempotencyMaxResultBytes;
  const closes = createCloses(deps);
  const bounds = { ...deps.jsonBounds, maxBytes: deps.bodyLimitBytes };
  const p: Pipeline = {
    deps,
    closes,
    newId,
    routing,
    bounds,
    tokens: deps.tokens ?? boundCounters,
    keeping: { deps, maxResultBytes },
    running: 0,
    whenIdle: [],
  };
  const quoting: Quoting = { deps, newId, bounds, routing };
  return {
    createQuote: (input) => createQuote(quoting, input),
    chatInto: (input, sink) => chatInto(p, input, sink),
    whenRecorded: async (requestId) => {
      await closes.whenRecorded(requestId);
      await deps.ledger.whenWritten?.(requestId);
    },
    whenAllRecorded: async () => {
      await closes.whenAllRecorded();
      await deps.ledger.whenAllWritten?.();
    },
    drain: async () => {
      if (p.running > 0) await new Promise<void>((resolve) => p.whenIdle.push(resolve));
      await closes.drain();
    },
    retryCloses: () => closes.retry(),
  };
}

/** A call is over: the last one wakes drain(). */
function settled(p: Pipeline): void {
  if (--p.running === 0) for (const resolve of p.whenIdle.splice(0)) resolve();
}

/**
 * One chat call, its answer pushed to `sink` (`ChatSink`, types.ts: the contract). Exactly one
 * terminal call: `completed` (from the answer), or `failed`/`cancelled` here when the call ended
 * without it. Settles when the call is over; rejects only with a failure after `completed`.
 */
async function chatInto(p: Pipeline, input: ChatInput, sink: ChatSink): Promise<void> {
  p.running++;
  // One span per call when tracing is on; undefined (and nothing allocated) when off.
  const trace = p.deps.tracer?.start(input);
  const call = new CallEnd(sink);
  const { stream } = call;
  try {
    if (input.dialect === undefined) await answer(p, input, stream, trace, call);
    else {
      // The translator stage: the dialect's body in as a chat completion, its events out.
      const dialect = dialects[input.dialect];
      const { body, model } = canonicalBody(dialect, input.body, p.bounds);
      await answer(p, { ...input, body }, stream, trace, translatingSink(dialect, model, call));
    }
  } catch (error) {
    trace?.end(error);
    if (call.done) throw error;
    call.done = true;
    call.releaseStream();
    if (input.signal.aborted) sink.cancelled(input.signal.reason);
    else sink.failed(error);
  } finally {
    trace?.end();
    call.releaseStream();
    settled(p);
  }
}

async function answer(
  p: Pipeline,
  input: ChatInput,
  stream: { release?: () => void },
  trace: ChatTrace | undefined,
  out: AnswerSink,
): Promise<void> {
  const arrivedAt = performance.now();
  const req = parseChatRequest(input.body, p.bounds);
  trace?.request(req.model, req.stream);
  // A stream counts against its key's limit from here (nothing claimed or reserved yet).
  if (req.stream && p.deps.acquireStream !== undefined)
    stream.release = await p.deps.acquireStream(input.apiKeyId);
  const key = input.idempotencyKey;
  if (key !== undefined) checkIdempotencyKey(key);
  const now = p.deps.clock();
  if (key === undefined) {
    await run(p, { req, input, now, arrivedAt, trace, out });
    return;
  }
  const stored = await claimKey(p.deps.idempotency, input, key, now);
  if (stored !== undefined) {
    trace?.step("replayed");
    await replay(stored, out);
    return;
  }
  // The answer's events kept for the key as they pass; its result stored once.
  const kept = new KeptAnswer(p.keeping, input, key, stream, out);
  try {
    await run(p, { req, input, now, arrivedAt, trace, out: kept });
  } catch (error) {
    await kept.interrupted(error);
    throw error;
  }
}

async function run(p: Pipeline, turn: ChatTurn): Promise<void> {
  const { req, input, now, trace } = turn;
  // Paid with x402 (no key): the payment in place of the permit (paid.ts).
  if (input.x402 !== undefined) {
    if (p.deps.x402 === undefined) throw new GatewayError("missing_api_key", "missing API key");
    await runPaid(p, turn, p.deps.x402);
    return;
  }
  // 1. Quote first: a stale or foreign quote is refused before anything else happens.
  const quote =
    input.quoteId === undefined
      ? undefined
      : await boundQuote(p.deps.quotes, input.quoteId, input.apiKeyId, req, now);
  if (quote !== undefined) trace?.step("quote");
  const { model, offers } = await p.deps.catalog.routingView(req.model);
  if (quote !== undefined) {
    const offer = offers.find((o) => o.offerId === quote.offerId);
    if (offer === undefined || offer.tariff.version !== quote.tariffVersion) {
      throw new GatewayError(
        "tariff_changed",
        `the tariff of offer ${quote.offerId} changed since the quote`,
      );
    }
  }

  // 2. Permit, read live from the chain.
  const pinnedOffer = req.offer ?? quote?.offerId;
  // Expiry by the chain's time as well as ours (PermitClock): a permit the chain holds expired
  // is refused even while the gateway's clock is behind.
  const permit = await checkPermit(input.permitId, p.deps.permits, {
    modelId: model.modelId,
    pinnedOfferId: pinnedOffer,
    now: p.deps.permitClock === undefined ? now : Math.max(now, p.deps.permitClock()),
  });
  // Only a key its payer authorized may spend it; refused from memory, before any reservation.
  // The authorizations that cover the permit, in the order a request is admitted through them.
  const grants = requireAuthority(input.authority, permit, now);
  trace?.step("permit");

  // 3. Route.
  const pins = [req.offer, quote?.offerId, permit.offerId];
  let candidates = rankCandidates(offers, model, req, pins, now, p.routing);
  if (candidates.length === 0) throw noEligibleOffer(req);
  // A supplied quote's maximum is what is reserved, its wake fee included when it said so.
  const maxPrice = req.provider?.maxPrice;
  if (quote !== undefined && maxPrice !== undefined) {
    const { inputTokens, maxOutputTokens, maximumCredits } = quote;
    const priced = { offer: candidates[0]!.offer, inputTokens, maxOutputTokens, maximumCredits };
    if (!fitsMaxPrice(priced, maxPrice)) throw maxPriceRefusal([priced], maxPrice);
  }
  // The payer's per-request caps (issue 28, item 7), from memory: an offer whose maximum for
  // this request fits none of them is not routed to, and a request that no offer fits is
  // refused before anything is reserved or any provider is called.
  candidates = withinPerRequestCaps(candidates, grants, quote?.maximumCredits);
  const failover = pins.every((pin) => pin === undefined);
  trace?.step("route");

  // 4. Count the prompt: only now that the request is admitted (its key, its permit and the
  // model's offers checked; DESIGN.md 10: nothing is counted before), and before anything is
  // reserved or any provider called, so that what the counter refuses (a conversation the
  // template refuses, an image it cannot price) is refused with nothing charged. Long prompts
  // are counted off the event loop. The count is the call's: its close is judged with it.
  const counter = p.tokens.forModel(model);
  if (counter === undefined) throw modelLoading(req.model);
  const inputCount = await counter.countInput(req);

  const admission = await admit(p, turn, {
    quote,
    model,
    permit,
    grants,
    candidates,
    failover,
    counter,
    inputCount,
  });
  await serve(p, admission, turn.out);
}

/**
 * The candidates whose maximum for this request (a supplied quote's, when there is one) fits
 * the per-request cap of at least one authorization in `grants`; throws 403
 * `authorization_per_request_cap_exceeded` when none does.
 */
function withinPerRequestCaps(
  candidates: Candidate[],
  grants: readonly PermitAuthorization[],
  quoted: bigint | undefined,
): Candidate[] {
  if (grants.some((g) => g.perRequestCap === 0n)) return candidates;
  const maximumOf = (c: Candidate) => quoted ?? c.maximumCredits;
  const kept = candidates.filter((c) => grants.some((g) => fitsPerRequestCap(g, maximumOf(c))));
  if (kept.length > 0) return kept;
  const least = candidates.reduce(
    (m, c) => (maximumOf(c) < m ? maximumOf(c) : m),
    maximumOf(candidates[0]!),
  );
  throw perRequestCapRefusal(grants, least);
}
