import type { Hex } from "viem";
import { mediaParts, parseChatRequest, type ChatRequest } from "../chat-request.js";
import { canonicalBody, dialects, translatingSink } from "../dialects/index.js";
import { GatewayError } from "../errors.js";
import {
  fitsPerRequestCap,
  perRequestCapRefusal,
  requireAuthority,
  totalCapRefusal,
  type PermitAuthorization,
} from "../permit-authorization.js";
import type { ModelRecord } from "../catalog.js";
import { checkPermit, type Permit } from "../permits.js";
import { randomHex } from "../random-id.js";
import { boundCounters, type TokenCounter, type TokenCounters } from "../tokens.js";
import { answerBridge } from "./bridge.js";
import { serve } from "./call.js";
import type { RelayContext } from "./call-state.js";
import { checkIdempotencyKey, claimKey, KeptAnswer, replay, type Keeping } from "./idempotent.js";
import { createCloses, type PendingClose } from "./lifecycle.js";
import type { ChatInput, ChatTrace, Inference, InferenceDeps, Ledger } from "./ports.js";
import { boundQuote, createQuote, noEligibleOffer, quoteRecord, type Quoting } from "./quotes.js";
import { fitsMaxPrice, maxPriceRefusal, rankCandidates, type Candidate } from "./routing.js";
import {
  defaultIdempotencyMaxResultBytes,
  type AnswerSink,
  type ChatChunk,
  type ChatCompleted,
  type ChatSink,
  type ChatStarted,
  type QuoteRecord,
} from "./types.js";

/**
 * The pipeline of a chat request, step by step: validate -> idempotency -> bind the quote ->
 * permit -> route -> reserve, then the call (`call.ts`) and its one close (`lifecycle.ts`); the
 * Idempotency-Key's keeping and replay are in `idempotent.ts`, quotes in `quotes.ts`.
 */

/**
 * The end of a call's sink chain: hands each event to the transport's sink and notes when the
 * terminal `completed` was called (one object per call; its methods are the prototype's).
 */
class CallEnd implements AnswerSink {
  done = false;
  /**
   * The stream's admission (`acquireStream`). Released before the client's last event is handed
   * on (completed, failed or cancelled): a client that has read its whole answer may open its
   * next stream at once, while this call's close is still being recorded.
   */
  readonly stream: { release?: () => void } = {};
  constructor(private readonly sink: ChatSink) {}
  started(event: ChatStarted): void | Promise<void> {
    return this.sink.started(event);
  }
  chunk(event: ChatChunk, parsed?: unknown): boolean {
    return this.sink.chunk(event, parsed);
  }
  drained(): Promise<void> {
    return this.sink.drained();
  }
  completed(event: ChatCompleted): void | Promise<void> {
    this.done = true;
    this.releaseStream();
    return this.sink.completed(event);
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
  const routing = { measured: (offerId: Hex) => deps.measurements?.get(offerId) };
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
  const into = (input: ChatInput, sink: ChatSink): Promise<void> => chatInto(p, input, sink);

  return {
    createQuote: (input) => createQuote(quoting, input),
    chatInto: into,
    chat: (input) => answerBridge(into, input),
    whenRecorded: async (requestId) => {
      await closes.whenRecorded(requestId);
      await deps.ledger.whenWritten?.(requestId);
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

/**
 * One chat request on its way through the steps: as parsed, as it came, the clock when it was
 * taken up (Unix seconds) and when it arrived (`performance.now()`), its trace and where its
 * answer goes.
 */
interface ChatTurn {
  readonly req: ChatRequest;
  readonly input: ChatInput;
  readonly now: number;
  readonly arrivedAt: number;
  readonly trace: ChatTrace | undefined;
  readonly out: AnswerSink;
}

async function run(p: Pipeline, turn: ChatTurn): Promise<void> {
  const { req, input, now, trace } = turn;
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

  // The model's token counter (its tokenizer loads the first time the model is served). What
  // it cannot count (an image for a model with no documented image cost) is refused now,
  // before anything is reserved; text is counted while the provider works (call-state.ts).
  const counter = await p.tokens.forModel(model);
  if (mediaParts(req.messages) > 0n) counter.countInput(req);

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

  await admit(p, turn, quote, model, permit, grants, candidates, failover, counter);
}

/**
 * 4. Reserve the maximum, durably, before any upstream call, through the first candidate (and
 * authorization) that admits it; then the call (`call.ts`).
 */
async function admit(
  p: Pipeline,
  turn: ChatTurn,
  quote: QuoteRecord | undefined,
  model: ModelRecord,
  permit: Permit,
  grants: readonly PermitAuthorization[],
  candidates: Candidate[],
  failover: boolean,
  counter: TokenCounter,
): Promise<void> {
  const { req, input, now, arrivedAt, trace, out } = turn;
  const requestId = p.newId();
  let chosen: Candidate | undefined;
  let quoteId: Hex | undefined;
  let maximumCredits = 0n;
  let admittedBy: PermitAuthorization | undefined;
  for (const c of quote === undefined ? candidates : candidates.slice(0, 1)) {
    const internal =
      quote === undefined
        ? quoteRecord(p.newId(), input.apiKeyId, req, model, c, now, true)
        : undefined;
    const q = quote ?? internal!;
    const reservation = {
      requestId,
      apiKeyId: input.apiKeyId,
      model: req.model,
      modelId: model.modelId,
      offerId: c.offer.offerId,
      permitId: permit.permitId,
      quoteId: q.quoteId,
      stream: req.stream,
      maximumCredits: q.maximumCredits,
      tariffVersion: c.offer.tariff.version,
      inputTokens: q.inputTokens,
      deposit: permit.deposit,
      chainSettled: permit.settled,
      maxConcurrency: c.offer.maxConcurrency,
      now,
      durable: quote !== undefined || input.idempotencyKey !== undefined,
      permitExpiresAt: permit.expiresAt,
      ...(internal === undefined ? {} : { quote: internal }),
    };
    // Through the first authorization whose per-request cap it fits; one with a total cap
    // reserves the maximum against the cap as well (the ledger's "Authorization caps"), and
    // when that cap is spent, the next one is tried.
    const through = grants.filter((g) => fitsPerRequestCap(g, q.maximumCredits));
    let grant = through[0]!;
    let result = await reserveOrVoid(p, requestId, reservationThrough(reservation, grant));
    for (const next of through.slice(1)) {
      if (result.ok || result.reason !== "authorization_cap_exhausted") break;
      grant = next;
      result = await reserveOrVoid(p, requestId, reservationThrough(reservation, grant));
    }
    if (result.ok) {
      // The wake fee only if the quote priced it (whatever the prober has seen since), and
      // only if this request claims it: the gateway saw the endpoint asleep, and no request
      // was charged it this wake window (wake-fees.ts).
      chosen = { ...c, wakes: q.wakesEndpoint && (await claimWakeFee(p, c.offer.offerId)) };
      quoteId = q.quoteId;
      maximumCredits = q.maximumCredits;
      admittedBy = grant;
      break;
    }
    if (result.reason === "authorization_cap_exhausted")
      throw totalCapRefusal(grant, q.maximumCredits);
    if (result.reason === "insufficient_credits") {
      throw new GatewayError(
        "insufficient_credits",
        `permit ${permit.permitId} cannot cover this request's maximum of ${q.maximumCredits} credits`,
      );
    }
    if (result.reason === "quote_used")
      throw new GatewayError("quote_used", `quote ${q.quoteId} has already been used`);
    // offer_at_capacity: the next offer, if routing may choose one.
    if (!failover) break;
  }
  if (chosen === undefined || quoteId === undefined || admittedBy === undefined) {
    throw new GatewayError(
      "offer_at_capacity",
      "every eligible offer is at its max_concurrency; retry shortly",
    );
  }
  const grant = admittedBy;
  trace?.admitted({
    requestId,
    quoteId,
    offerId: chosen.offer.offerId,
    permitId: permit.permitId,
    maximumCredits,
  });

  await serve(
    p,
    {
      req,
      input,
      permit,
      requestId,
      quoteId,
      maximumCredits,
      chosen,
      // A failover's offer is charged no wake fee: none was claimed for it; and it stays
      // within the per-request cap of the authorization that admitted the request.
      candidates: candidates
        .filter((c) => fitsPerRequestCap(grant, c.maximumCredits))
        .map((c) => (c.wakes ? { ...c, wakes: false } : c)),
      failover,
      arrivedAt,
      trace,
      counter,
    },
    out,
  );
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

/** Whether this request is charged its offer's wake fee (absent `wakeFees`: never). */
async function claimWakeFee(p: Pipeline, offerId: Hex): Promise<boolean> {
  return p.deps.wakeFees === undefined ? false : p.deps.wakeFees.claim(offerId);
}

/** A reservation admitted through `grant`: recorded on the request, and capped by its total. */
function reservationThrough(
  reservation: Parameters<Ledger["reserve"]>[0],
  grant: PermitAuthorization,
): Parameters<Ledger["reserve"]>[0] {
  return { ...reservation, authorizationId: grant.id, capped: grant.totalCap !== 0n };
}

/**
 * The reservation, or a clear 503. When the call fails its outcome is unknown (a COMMIT whose
 * answer was lost, or a statement still running): the request is closed as failed and void
 * with the reservation's data (`voidReservation`), so a reservation that landed is released
 * and one that lands later holds nothing. That close is a close like any other: one the
 * database refuses too (it is likely away, having just lost an answer) waits in the outbox,
 * which housekeeping writes every round until the database takes it. The orphan rule would
 * never free it: this process is alive. A reservation the ledger refused before sending it
 * (`sent: false`, backpressure) has a known outcome, nothing, so no close is sent: the 503
 * is not delayed by it, and an overloaded database is not given one more write. No provider
 * is called either way.
 */
async function reserveOrVoid(
  p: Pipeline,
  requestId: Hex,
  input: Parameters<Ledger["reserve"]>[0],
): ReturnType<Ledger["reserve"]> {
  try {
    return await p.deps.ledger.reserve(input);
  } catch (error) {
    // The ledger's own answer (a lease refused before anything was sent, a closing permit).
    if (error instanceof GatewayError) throw error;
    const neverSent = (error as { sent?: unknown } | null | undefined)?.sent === false;
    if (!neverSent) {
      const close: PendingClose = {
        finalize: {
          requestId,
          status: "failed",
          inputTokens: 0n,
          outputTokens: 0n,
          creditsCharged: 0n,
          billing: "void",
          usageSource: "gateway",
          error: "reservation failed",
          now: p.deps.clock(),
        },
        flag: undefined,
        reservation: input,
      };
      await p.closes.write(close).catch(() => p.closes.enqueue(close));
    }
    throw new GatewayError("database_unavailable", "the reservation could not be stored", {
      cause: error,
    });
  }
}
