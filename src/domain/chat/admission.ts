import type { SignedUsageReceipt } from "../receipt-types.js";
import type { ReceiptRecord } from "../receipts.js";
import type { Hex } from "viem";
import type { ModelRecord } from "../catalog.js";
import { GatewayError } from "../errors.js";
import {
  budgetWarning,
  fitsPerRequestCap,
  periodCapRefusal,
  periodStart,
  reservesAgainstCap,
  totalCapRefusal,
  type BudgetWarning,
  type PermitAuthorization,
} from "../permit-authorization/index.js";
import type { Permit } from "../permits.js";
import type { TokenCounter } from "../tokens.js";
import type { Closes, PendingClose } from "./lifecycle.js";
import type { ChatInput, ChatTrace, InferenceDeps, ReserveInput, ReserveResult } from "./ports.js";
import { quoteRecord } from "./quotes.js";
import type { ChatRequest } from "./request/index.js";
import type { Candidate } from "./routing.js";
import type { AnswerSink, QuoteRecord } from "./types.js";

/**
 * A chat request's admission (step 5 of the pipeline, pipeline.ts): its maximum reserved,
 * durably, through the first candidate and authorization that admit it, and the one value the
 * call (call.ts) then serves: the {@link Admission}.
 */

/**
 * An admitted request: what the pipeline reserved, for the call to serve. One value, made once:
 * the call and its provider calls read the chosen offer's output limit and bound from it
 * ({@link Candidate}), never derive them again.
 */
export interface Admission {
  readonly req: ChatRequest;
  readonly input: ChatInput;
  readonly requestId: Hex;
  readonly quoteId: Hex;
  readonly permit: Permit;
  /** The offer reserved for, with the request's output limit and bound on it. */
  readonly chosen: Candidate;
  /**
   * The offers a failover before the first byte may switch to, each with its own limit, bound
   * and maximum; none when the request pins its offer.
   */
  readonly candidates: readonly Candidate[];
  /** The maximum reserved (a supplied quote's, else the chosen offer's). */
  readonly maximumCredits: bigint;
  /** `performance.now()` when the pipeline took the request (for the overhead metric). */
  readonly arrivedAt: number;
  /** The call's trace; undefined when tracing is off. */
  readonly trace: ChatTrace | undefined;
  /** The model's token counter: the gateway's own count of what is billed. */
  readonly counter: TokenCounter;
  /**
   * The prompt's tokens by `counter`, counted once the request was routed and before it was
   * reserved: the close's judgment stays synchronous.
   */
  readonly inputCount: bigint;
  /** Signs the receipt a streamed answer ends with ({@link Routed.receipt}). */
  readonly receipt?: SignReceipt | undefined;
  /** The payer's soft threshold, reached by this admission's authorization (issue 38). */
  readonly budgetWarning?: BudgetWarning | undefined;
}

/** Signs the usage receipt of a closed record (domain/receipts.ts). */
export type SignReceipt = (record: ReceiptRecord) => Promise<SignedUsageReceipt>;

/**
 * One chat request on its way through the steps: as parsed, as it came, the clock when it was
 * taken up (Unix seconds) and when it arrived (`performance.now()`), its trace and where its
 * answer goes.
 */
export interface ChatTurn {
  readonly req: ChatRequest;
  readonly input: ChatInput;
  readonly now: number;
  readonly arrivedAt: number;
  readonly trace: ChatTrace | undefined;
  readonly out: AnswerSink;
}

/** A request routed and counted (pipeline.ts, steps 1 to 4): what admission reserves for. */
export interface Routed {
  /** The supplied quote, checked and bound to its offer. */
  readonly quote: QuoteRecord | undefined;
  readonly model: ModelRecord;
  readonly permit: Permit;
  /** The authorizations that cover the permit, in the order a request is admitted through them. */
  readonly grants: readonly PermitAuthorization[];
  /** The offers that may serve, best first. */
  readonly candidates: readonly Candidate[];
  /** Whether routing may choose another offer (no pin). */
  readonly failover: boolean;
  readonly counter: TokenCounter;
  readonly inputCount: bigint;
  /**
   * Reserve per request in the database, never from a lease: a request paid with x402 (its
   * permit is its own, single-use).
   */
  readonly durable?: boolean | undefined;
  /**
   * Signs the receipt a streamed answer ends with (a request paid with x402: its headers are
   * gone by then); absent: the answer ends as every other.
   */
  readonly receipt?: SignReceipt | undefined;
}

/** What admission needs of the pipeline. */
export interface Admitting {
  readonly deps: InferenceDeps;
  readonly closes: Closes;
  readonly newId: () => Hex;
}

/**
 * 5. Reserve the maximum, durably, before any upstream call, through the first candidate (and
 * authorization) that admits it: the request's {@link Admission}, for the call (`call.ts`).
 */
export async function admit(p: Admitting, turn: ChatTurn, routed: Routed): Promise<Admission> {
  const { quote, model, permit, grants, candidates, failover } = routed;
  const { req, input, now, arrivedAt, trace } = turn;
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
      durable: routed.durable === true || quote !== undefined || input.idempotencyKey !== undefined,
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
      if (result.ok || !capRefusals.has(result.reason)) break;
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
    if (result.reason === "authorization_period_cap_exhausted")
      throw periodCapRefusal(grant, q.maximumCredits, now);
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
  // Only now, admitted (authorized, reserved: paid for), is the request's shape seen by the
  // audits' sample (src/domain/audits/shapes.ts): a refused request frames no audit.
  p.deps.observeRequest?.(model.modelId, req, input.dialect, input.apiKeyId, permit.payer);
  const warning = await thresholdReached(p, grant, now);
  trace?.admitted({
    requestId,
    quoteId,
    offerId: chosen.offer.offerId,
    permitId: permit.permitId,
    maximumCredits,
  });

  return {
    req,
    input,
    requestId,
    quoteId,
    permit,
    chosen,
    // A failover's offer is charged no wake fee: none was claimed for it; and it stays
    // within the per-request cap of the authorization that admitted the request.
    candidates: failover
      ? candidates
          .filter((c) => fitsPerRequestCap(grant, c.maximumCredits))
          .map((c) => (c.wakes ? { ...c, wakes: false } : c))
      : [],
    maximumCredits,
    arrivedAt,
    trace,
    counter: routed.counter,
    inputCount: routed.inputCount,
    ...(routed.receipt === undefined || !req.stream ? {} : { receipt: routed.receipt }),
    ...(warning === undefined ? {} : { budgetWarning: warning }),
  };
}

/**
 * The payer's soft threshold on the authorization that admitted the request (issue 38), read on
 * its ledger just after the admission: the warning the answer carries when the use is at or over
 * it, the crossing counted once per period. A warning is advice: when its read fails, the
 * request is served without one.
 */
async function thresholdReached(
  p: Admitting,
  grant: PermitAuthorization,
  now: number,
): Promise<BudgetWarning | undefined> {
  const thresholds = p.deps.thresholds;
  if (grant.warnAt === 0n || thresholds === undefined) return undefined;
  const measured = await thresholds.measure(grant.id, grant.warnAt).catch(() => undefined);
  if (measured === undefined) return undefined;
  const warning = budgetWarning(grant, measured.used, now);
  if (warning !== undefined) p.deps.observer?.budgetWarned?.(grant.period, measured.crossed);
  return warning;
}

/** Whether this request is charged its offer's wake fee (absent `wakeFees`: never). */
async function claimWakeFee(p: Admitting, offerId: Hex): Promise<boolean> {
  return p.deps.wakeFees === undefined ? false : p.deps.wakeFees.claim(offerId);
}

/** The refusals of an authorization's own caps: the next capped authorization is tried. */
const capRefusals: ReadonlySet<string> = new Set([
  "authorization_cap_exhausted",
  "authorization_period_cap_exhausted",
]);

/**
 * A reservation admitted through `grant`: recorded on the request, and capped by its total or
 * its periodic cap (issue 38: counted against the period that holds the gateway's `now`).
 */
function reservationThrough(reservation: ReserveInput, grant: PermitAuthorization): ReserveInput {
  return {
    ...reservation,
    authorizationId: grant.id,
    capped: reservesAgainstCap(grant),
    ...(grant.period === "" ? {} : { periodStart: periodStart(grant.period, reservation.now) }),
  };
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
  p: Admitting,
  requestId: Hex,
  input: ReserveInput,
): Promise<ReserveResult> {
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
