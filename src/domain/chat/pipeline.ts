import { createHash } from "node:crypto";
import type { Hex } from "viem";
import type { ModelRecord } from "../catalog.js";
import {
  mediaParts,
  parseChatRequest,
  quoteFingerprint,
  type ChatRequest,
} from "../chat-request.js";
import { canonicalBody, dialects, translatingSink, type DialectName } from "../dialects/index.js";
import { GatewayError } from "../errors.js";
import { isHex32, normalizeHex } from "../hex.js";
import {
  fitsPerRequestCap,
  perRequestCapRefusal,
  requireAuthority,
  totalCapRefusal,
  type PermitAuthorization,
} from "../permit-authorization.js";
import { checkPermit } from "../permits.js";
import { randomHex } from "../random-id.js";
import { boundCounters } from "../tokens.js";
import { createCloses, type PendingClose } from "./lifecycle.js";
import { answerBridge } from "./bridge.js";
import { serve } from "./relay.js";
import { fitsMaxPrice, maxPriceRefusal, rankCandidates, type Candidate } from "./routing.js";
import type { AnswerSink, ChatSink } from "./sink.js";
import {
  defaultIdempotencyMaxResultBytes,
  idempotencyLifetimeSeconds,
  quoteLifetimeSeconds,
  type ChatChunk,
  type ChatCompleted,
  type ChatEvent,
  type ChatInput,
  type ChatStarted,
  type ChatTrace,
  type Inference,
  type InferenceDeps,
  type Ledger,
  type QuoteRecord,
} from "./types.js";

/**
 * The pipeline of a chat request, step by step: validate -> idempotency -> bind the quote ->
 * permit -> route -> reserve, then the relay (`relay.ts`) and its one close (`lifecycle.ts`).
 */

function requestFingerprint(input: ChatInput): string {
  const hash = createHash("sha256")
    .update(input.body)
    .update("\0")
    .update(input.permitId ?? "")
    .update("\0")
    .update(input.quoteId ?? "");
  // A dialect's body is another request than the same bytes as a chat completion.
  if (input.dialect !== undefined) hash.update("\0").update(input.dialect);
  return hash.digest("hex");
}

/**
 * The end of a call's sink chain: hands each event to the transport's sink and notes when the
 * terminal `completed` was called (one object per call; its methods are the prototype's).
 */
class CallEnd implements AnswerSink {
  done = false;
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
    return this.sink.completed(event);
  }
}

export function createInference(deps: InferenceDeps): Inference {
  const newId = deps.newId ?? ((): Hex => `0x${randomHex(32)}`);

  const resolve = (req: ChatRequest) => deps.catalog.routingView(req.model);
  const routing = { measured: (offerId: Hex) => deps.measurements?.get(offerId) };
  const maxResultBytes = deps.idempotencyMaxResultBytes ?? defaultIdempotencyMaxResultBytes;
  const closes = createCloses(deps);
  // Chat calls under way, so that drain() (shutdown) also waits for the closes of requests
  // that were cut, which are written as their calls unwind.
  let running = 0;
  const whenIdle: (() => void)[] = [];
  const settled = (): void => {
    if (--running === 0) for (const resolve of whenIdle.splice(0)) resolve();
  };

  const bounds = { ...deps.jsonBounds, maxBytes: deps.bodyLimitBytes };
  const tokens = deps.tokens ?? boundCounters;

  const createQuote = async (input: {
    apiKeyId: string;
    body: Uint8Array;
    dialect?: DialectName | undefined;
  }): Promise<QuoteRecord> => {
    const body =
      input.dialect === undefined
        ? input.body
        : canonicalBody(dialects[input.dialect], input.body, bounds).body;
    const req = parseChatRequest(body, bounds);
    const now = deps.clock();
    const { model, offers } = await resolve(req);
    const [best] = rankCandidates(offers, model, req, [req.offer], now, routing);
    if (best === undefined) throw noEligibleOffer(req);
    const quote = quoteRecord(newId(), input.apiKeyId, req, model, best, now, false);
    await deps.quotes.insert(quote);
    return quote;
  };

  function quoteRecord(
    quoteId: Hex,
    apiKeyId: string,
    req: ChatRequest,
    model: ModelRecord,
    c: Candidate,
    now: number,
    internal: boolean,
  ): QuoteRecord {
    return {
      quoteId,
      apiKeyId,
      model: req.model,
      modelId: model.modelId,
      offerId: c.offer.offerId,
      tariffVersion: c.offer.tariff.version,
      inputTokens: c.inputTokens,
      maxOutputTokens: c.maxOutputTokens,
      wakesEndpoint: c.wakes,
      maximumCredits: c.maximumCredits,
      fingerprint: quoteFingerprint(req),
      createdAt: now,
      expiresAt: now + quoteLifetimeSeconds,
      internal,
      usedBy: null,
    };
  }

  function noEligibleOffer(req: ChatRequest): GatewayError {
    return new GatewayError(
      "no_eligible_offer",
      req.offer === undefined
        ? `no verified, active offer of '${req.model.slice(0, 200)}' can serve this request now`
        : `offer ${req.offer} cannot serve this request now (not active, verified and registered for this model, or out of routing for usage claims above the gateway's count until it is verified again)`,
    );
  }

  /** Checks a supplied quote, in the order DESIGN.md gives; returns it bound to its offer. */
  async function boundQuote(quoteId: string, apiKeyId: string, req: ChatRequest, now: number) {
    if (!isHex32(quoteId)) throw new GatewayError("invalid_hex", "X-Gateway-Quote must be a Hex32");
    const quote = await deps.quotes.get(normalizeHex(quoteId));
    if (quote === undefined || quote.apiKeyId !== apiKeyId || quote.internal) {
      throw new GatewayError("quote_not_found", `quote ${quoteId} does not exist`);
    }
    // The stored expiry decides (quotes are made with createdAt + quoteLifetimeSeconds).
    if (now > quote.expiresAt) {
      throw new GatewayError("quote_expired", `quote ${quoteId} expired at ${quote.expiresAt}`);
    }
    if (quote.fingerprint !== quoteFingerprint(req)) {
      throw new GatewayError(
        "quote_mismatch",
        "the request differs from the quoted one in model, messages, n, output limit, tools, tool choice or response format",
      );
    }
    if (quote.usedBy !== null)
      throw new GatewayError("quote_used", `quote ${quoteId} has already been used`);
    return quote;
  }

  /**
   * One chat call, its answer pushed to `sink` (sink.ts: the contract). Exactly one terminal
   * call: `completed` (from the answer), or `failed`/`cancelled` here when the call ended
   * without it. Settles when the call is over; rejects only with a failure after `completed`.
   */
  async function chatInto(input: ChatInput, sink: ChatSink): Promise<void> {
    running++;
    const stream: { release?: () => void } = {};
    // One span per call when tracing is on; undefined (and nothing allocated) when off.
    const trace = deps.tracer?.start(input);
    const call = new CallEnd(sink);
    try {
      if (input.dialect === undefined) await answer(input, stream, trace, call);
      else {
        // The translator stage: the dialect's body in as a chat completion, its events out.
        const dialect = dialects[input.dialect];
        const { body, model } = canonicalBody(dialect, input.body, bounds);
        await answer({ ...input, body }, stream, trace, translatingSink(dialect, model, call));
      }
    } catch (error) {
      trace?.end(error);
      if (call.done) throw error;
      call.done = true;
      if (input.signal.aborted) sink.cancelled(input.signal.reason);
      else sink.failed(error);
    } finally {
      trace?.end();
      stream.release?.();
      settled();
    }
  }

  async function answer(
    input: ChatInput,
    stream: { release?: () => void },
    trace: ChatTrace | undefined,
    out: AnswerSink,
  ): Promise<void> {
    const arrivedAt = performance.now();
    const req = parseChatRequest(input.body, bounds);
    trace?.request(req.model, req.stream);
    // A stream counts against its key's limit from here (nothing claimed or reserved yet).
    if (req.stream && deps.acquireStream !== undefined)
      stream.release = await deps.acquireStream(input.apiKeyId);
    const key = input.idempotencyKey;
    if (
      key !== undefined &&
      (key.length === 0 || key.length > 255 || !/^[\x21-\x7e]+$/.test(key))
    ) {
      throw new GatewayError(
        "invalid_request",
        "Idempotency-Key must be 1 to 255 visible ASCII characters",
      );
    }
    const now = deps.clock();
    if (key !== undefined) {
      const claim = await deps.idempotency.claim({
        apiKeyId: input.apiKeyId,
        key,
        fingerprint: requestFingerprint(input),
        now,
        expiresAt: now + idempotencyLifetimeSeconds,
      });
      if (claim.state === "in_progress") {
        throw new GatewayError(
          "idempotency_in_progress",
          "a request with this Idempotency-Key is still in progress",
        );
      }
      if (claim.state === "mismatch") {
        throw new GatewayError(
          "idempotency_key_reused",
          "this Idempotency-Key was used with a different request",
        );
      }
      if (claim.state === "completed") {
        trace?.step("replayed");
        await replay(claim.events, out);
        return;
      }
    }

    // The events handed to the client so far, and whether the key is done with: its result
    // stored (the completed answer, or how an answer that began ended) or the key released.
    // Once only: a stored completed result is never followed by a failed one, whatever fails
    // after it (the consumer stopping, the close's record throwing).
    const events: ChatEvent[] = [];
    let started = false;
    let keyDone = key === undefined;
    // Chunk bytes kept for the key, and whether the answer outgrew IDEMPOTENCY_MAX_RESULT_BYTES:
    // then only its `started` event is kept (what the store needs), the answer goes on for its
    // client, and the result stored says it cannot be replayed (DESIGN.md 8: bounded memory).
    let keptBytes = 0;
    let tooLarge = false;
    const tooLargeResult = (): ChatEvent[] => {
      const first = events[0];
      const requestId = first?.type === "started" ? first.requestId : "";
      return [
        ...events.slice(0, 1),
        {
          type: "failed",
          code: "idempotency_result_too_large",
          message: `the answer to this Idempotency-Key (request ${requestId}) was larger than ${maxResultBytes} bytes and was not kept, so it cannot be replayed; it was charged once (GET /v1/requests/${requestId})`,
        },
      ];
    };
    // An answer that ended without completing: nothing reached the client, and the key is free
    // for a corrected retry; or the answer began, and its outcome (any partial charge
    // included) is the key's for good.
    const finishInterrupted = async (error: unknown) => {
      if (keyDone || key === undefined) return;
      keyDone = true;
      if (!started) {
        await deps.idempotency.release({ apiKeyId: input.apiKeyId, key });
        return;
      }
      if (tooLarge) {
        await storeResult(input, key, tooLargeResult());
        return;
      }
      const failure = error instanceof GatewayError ? error : undefined;
      await storeResult(input, key, [
        ...events,
        {
          type: "failed",
          code:
            failure?.code === "upstream_unavailable" ? "upstream_unavailable" : "upstream_error",
          message: failure?.message ?? "the answer was interrupted",
        },
      ]);
    };
    // The answer's events on their way out: kept for the key as they pass.
    const keep = (event: ChatEvent): void => {
      if (key === undefined || keyDone) return;
      if (event.type === "chunk" && !tooLarge) {
        keptBytes += event.data.byteLength;
        if (keptBytes > maxResultBytes) {
          tooLarge = true;
          events.length = Math.min(events.length, 1);
        }
      }
      if (!tooLarge) events.push(event);
    };
    const kept: AnswerSink = {
      started: async (event: ChatStarted) => {
        // The claim names its request before the answer begins: should this process die
        // after the charge, with the result unstored, the key is not released (the orphan
        // rule keeps the claims of charged requests). Failing here, nothing began: the key
        // is released and the reservation voided.
        if (key !== undefined)
          await deps.idempotency.begin({
            apiKeyId: input.apiKeyId,
            key,
            requestId: event.requestId,
          });
        started = true;
        keep(event);
        await out.started(event);
      },
      chunk: (event: ChatChunk, parsed?: unknown) => {
        keep(event);
        return out.chunk(event, parsed);
      },
      drained: () => out.drained(),
      completed: async (event: ChatCompleted) => {
        // The client has its whole answer: its stream no longer counts (the charge's record may
        // still be in flight).
        stream.release?.();
        // Stored before the last event is handed on: a consumer may stop reading right after it.
        if (key !== undefined && !keyDone) {
          keyDone = true;
          await storeCompleted(input, key, tooLarge ? tooLargeResult() : [...events, event]);
        }
        await out.completed(event);
      },
    };
    try {
      await run(req, input, now, arrivedAt, trace, key === undefined ? out : kept);
    } catch (error) {
      await finishInterrupted(error);
      throw error;
    }
  }

  /**
   * Stores a completed answer's result for its key. A store that fails does not fail the
   * answer: it is complete and its charge is being recorded, so the client gets what it pays
   * for; only the replay is lost, which is reported (`onIdempotencyResultLost`). The key keeps
   * its claim: a retry is refused 409 `idempotency_in_progress`, never served and charged again.
   */
  async function storeCompleted(input: ChatInput, key: string, events: readonly ChatEvent[]) {
    try {
      await storeResult(input, key, events);
    } catch (error) {
      const first = events[0];
      deps.onIdempotencyResultLost?.({
        requestId: first?.type === "started" ? first.requestId : "",
        error,
      });
    }
  }

  async function storeResult(input: ChatInput, key: string, events: readonly ChatEvent[]) {
    const first = events[0];
    if (first?.type !== "started") return;
    await deps.idempotency.complete({
      apiKeyId: input.apiKeyId,
      key,
      requestId: first.requestId,
      events,
    });
  }

  async function replay(events: readonly ChatEvent[], out: AnswerSink): Promise<void> {
    // An answer too large to keep: its error at once, before any answer begins.
    const last = events.at(-1);
    if (last?.type === "failed" && last.code === "idempotency_result_too_large")
      throw new GatewayError(last.code, last.message);
    for (const event of events) {
      if (event.type === "started") await out.started({ ...event, replayed: true });
      else if (event.type === "failed") throw new GatewayError(event.code, event.message);
      else if (event.type === "completed") await out.completed(event);
      else if (!out.chunk(event)) await out.drained();
    }
  }

  async function run(
    req: ChatRequest,
    input: ChatInput,
    now: number,
    arrivedAt: number,
    trace: ChatTrace | undefined,
    out: AnswerSink,
  ): Promise<void> {
    // 1. Quote first: a stale or foreign quote is refused before anything else happens.
    const quote =
      input.quoteId === undefined
        ? undefined
        : await boundQuote(input.quoteId, input.apiKeyId, req, now);
    if (quote !== undefined) trace?.step("quote");
    const { model, offers } = await resolve(req);
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
    // before anything is reserved; text is counted while the provider works (relay.ts).
    const counter = await tokens.forModel(model);
    if (mediaParts(req.messages) > 0n) counter.countInput(req);

    // 2. Permit, read live from the chain.
    const pinnedOffer = req.offer ?? quote?.offerId;
    // Expiry by the chain's time as well as ours (PermitClock): a permit the chain holds expired
    // is refused even while the gateway's clock is behind.
    const permit = await checkPermit(input.permitId, deps.permits, {
      modelId: model.modelId,
      pinnedOfferId: pinnedOffer,
      now: deps.permitClock === undefined ? now : Math.max(now, deps.permitClock()),
    });
    // Only a key its payer authorized may spend it; refused from memory, before any reservation.
    // The authorizations that cover the permit, in the order a request is admitted through them.
    const grants = requireAuthority(input.authority, permit, now);
    trace?.step("permit");

    // 3. Route.
    const pins = [req.offer, quote?.offerId, permit.offerId];
    let candidates = rankCandidates(offers, model, req, pins, now, routing);
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
    const failover = pins.every((p) => p === undefined);
    trace?.step("route");

    // 4. Reserve the maximum, durably, before any upstream call.
    const requestId = newId();
    let chosen: Candidate | undefined;
    let quoteId: Hex | undefined;
    let maximumCredits = 0n;
    let admittedBy: PermitAuthorization | undefined;
    for (const c of quote === undefined ? candidates : candidates.slice(0, 1)) {
      const internal =
        quote === undefined
          ? quoteRecord(newId(), input.apiKeyId, req, model, c, now, true)
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
      let result = await reserveOrVoid(requestId, reservationThrough(reservation, grant));
      for (const next of through.slice(1)) {
        if (result.ok || result.reason !== "authorization_cap_exhausted") break;
        grant = next;
        result = await reserveOrVoid(requestId, reservationThrough(reservation, grant));
      }
      if (result.ok) {
        // The wake fee only if the quote priced it (whatever the prober has seen since), and
        // only if this request claims it: the gateway saw the endpoint asleep, and no request
        // was charged it this wake window (wake-fees.ts).
        chosen = { ...c, wakes: q.wakesEndpoint && (await claimWakeFee(c.offer.offerId)) };
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
      { deps, closes },
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
  async function claimWakeFee(offerId: Hex): Promise<boolean> {
    return deps.wakeFees === undefined ? false : deps.wakeFees.claim(offerId);
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
    requestId: Hex,
    input: Parameters<Ledger["reserve"]>[0],
  ): ReturnType<Ledger["reserve"]> {
    try {
      return await deps.ledger.reserve(input);
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
            now: deps.clock(),
          },
          flag: undefined,
          reservation: input,
        };
        await closes.write(close).catch(() => closes.enqueue(close));
      }
      throw new GatewayError("database_unavailable", "the reservation could not be stored", {
        cause: error,
      });
    }
  }

  return {
    createQuote,
    chatInto,
    chat: (input) => answerBridge(chatInto, input),
    whenRecorded: async (requestId) => {
      await closes.whenRecorded(requestId);
      await deps.ledger.whenWritten?.(requestId);
    },
    drain: async () => {
      if (running > 0) await new Promise<void>((resolve) => whenIdle.push(resolve));
      await closes.drain();
    },
    retryCloses: () => closes.retry(),
  };
}
