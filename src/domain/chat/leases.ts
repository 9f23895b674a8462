import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { Epochs, type Epoch } from "./lease-epochs.js";
import { createPools, type LeasePool } from "./lease-pool.js";
import { LeaseReturns } from "./lease-returns.js";
import type { LeasedRecord, LeaseSignals, LeaseStore, OpenState } from "./lease-store.js";
import type { Ledger } from "./ports.js";

/**
 * Reservation leases (docs/decisions/chat-quotes-and-money.md, "Reservation leases"; migration 010): this process
 * takes credits of a permit and slots of an offer in bulk, and admits requests against them in
 * memory. Only taking more (an extension) or giving back touches the database, and a refusal
 * (`insufficient_credits`, `offer_at_capacity`) is always the database's: a request waits for
 * an extension, and is refused only when the database refuses to extend the lease by what the
 * request lacks. A leased request's record is written in a batch while its upstream call runs,
 * and its close moves its charge out of the lease in a batch. Requests that bring a quote or an
 * Idempotency-Key keep the per-request reservation (`durable`), and so do requests capped by
 * their authorization's total (`capped`).
 *
 * Leases belong to a holder: an epoch of this process, heartbeated while it admits, retired
 * before others could take it for dead (lease-epochs.ts). Each lease is a pool of this process
 * (lease-pool.ts); what a pool does not use goes back when idle or recalled (lease-returns.ts).
 */

export interface LeaseOptions {
  readonly store: LeaseStore;
  /** The per-request ledger: durable requests, and every request not admitted here. */
  readonly fallback: Ledger;
  readonly instanceId: string;
  /** Unix seconds (records). */
  readonly clock: () => number;
  /**
   * Unix seconds a permit's expiry is judged by (`PermitClock.now`: the later of the gateway's
   * clock and the chain's latest block time); default `clock`.
   */
  readonly permitClock?: () => number;
  /** Milliseconds, monotonic (lease timing); default performance.now. */
  readonly monotonicMs?: () => number;
  /** Other processes take a holder silent this long for dead (the orphan rule; default 60). */
  readonly staleAfterSeconds?: number;
  readonly heartbeatMs?: number;
  /** A lease unused this long is given back (default 1000). */
  readonly idleMs?: number;
  readonly tickMs?: number;
  /** Requests waiting per lease for an extension before more are refused (503, backpressure). */
  readonly maxQueued?: number | undefined;
  /** How long a request may wait for an extension before it is refused (503, not admitted). */
  readonly maxWaitMs?: number | undefined;
  /**
   * Lease recall between processes (LISTEN/NOTIFY on PostgreSQL); without it (one process)
   * a refusal other holders could cover waits once per window for their idle give-back.
   */
  readonly signals?: LeaseSignals | undefined;
}

interface LeasedRequest {
  readonly record: LeasedRecord;
  readonly epoch: Epoch;
  permitPool: LeasePool;
  offerPool: LeasePool;
  readonly open: OpenState;
  readonly written: Promise<void>;
  closing: Promise<{ finalized: boolean; creditsCharged: bigint }> | undefined;
  /** Its offer slot, held until the provider is done with it (the close starts). */
  slotHeld: boolean;
}

export interface LeasedLedger extends Ledger {
  /** Settles once the request's record write (if any is pending) has ended. */
  whenWritten(requestId: string): Promise<void>;
  /** A permit's close was requested: admit nothing more on it, give its leases back at once. */
  revokePermit(permitId: Hex): void;
  /** One round of heartbeat, idle return and epoch checks (the timer calls it). */
  tick(): Promise<void>;
  start(): void;
  /** Stops the timer and gives every lease back (after the requests have closed). */
  stop(): Promise<void>;
  /** For tests and metrics: what this process holds. */
  held(): { permits: Map<Hex, bigint>; offers: Map<Hex, bigint>; holder: string };
}

export function createLeasedLedger(options: LeaseOptions): LeasedLedger {
  const { store, fallback } = options;
  const mono = options.monotonicMs ?? (() => performance.now());
  const staleMs = (options.staleAfterSeconds ?? 60) * 1000;
  const heartbeatMs = options.heartbeatMs ?? Math.min(5_000, staleMs / 6);
  // Admission stops this long before the others could release the epoch's leases.
  const marginMs = staleMs / 4;
  const idleMs = options.idleMs ?? 1_000;
  const tickMs = options.tickMs ?? 250;
  const signals = options.signals;
  const pools = createPools({
    mono,
    idleMs,
    tickMs,
    maxQueued: options.maxQueued ?? Number.POSITIVE_INFINITY,
    maxWaitMs: options.maxWaitMs,
    recall: signals === undefined ? undefined : (pool) => signals.recall(`${pool.kind}:${pool.id}`),
    // Near the end of a permit's credits (an offer's slots), what a closing request frees goes
    // back at once: the database, not this process's idle lease, decides the next request.
    onFree: (pool) => {
      if (!pool.busy) void returns.giveBack(pool, false);
    },
  });
  const { newPool, acquire, release, closeStarted, closeEnded, rejectAll } = pools;
  const requests = new Map<string, LeasedRequest>();
  const revoked = new Set<Hex>();
  let timer: NodeJS.Timeout | undefined;
  let ticking: Promise<void> | undefined;

  const epochs = new Epochs({ instanceId: options.instanceId, store, mono, staleMs, marginMs });
  const returns = new LeaseReturns({ store, epochs, pools, signals });

  /** The epoch's pool of a permit or an offer: one per lease row. */
  const poolOf = (epoch: Epoch, kind: LeasePool["kind"], id: Hex): LeasePool => {
    const key = `${kind}:${id}`;
    let pool = epoch.pools.get(key);
    if (pool === undefined) {
      pool = newPool(kind, id, epoch.holder);
      epoch.pools.set(key, pool);
    }
    return pool;
  };

  /** A lease error: the request was not admitted (nothing of it reached the database). */
  const unavailable = (error: unknown) =>
    Object.assign(
      new GatewayError("database_unavailable", "the reservation lease could not be extended", {
        cause: error,
      }),
      { sent: false },
    );

  const permitClosing = (permitId: Hex) =>
    new GatewayError("permit_closing", `permit ${permitId} is closing; it admits no new request`);

  const reserve: Ledger["reserve"] = async (input) => {
    // A request capped by its authorization's total reserves against the cap per request
    // (adapters/pg/ledger.ts, "Authorization caps"): a cap leased to one process would refuse
    // another's request while it sat idle here.
    if (input.durable === true || input.capped === true) return reservePerRequest(input);
    const permitId = input.permitId.toLowerCase() as Hex;
    if (revoked.has(permitId)) throw permitClosing(input.permitId);
    let epoch: Epoch;
    try {
      epoch = await epochs.admitting();
    } catch (error) {
      throw unavailable(error);
    }
    const offerPool = poolOf(epoch, "offer", input.offerId.toLowerCase() as Hex);
    const permitPool = poolOf(epoch, "permit", permitId);
    if (input.permitExpiresAt !== undefined) permitPool.expiresAt = input.permitExpiresAt;
    // Credits first, then the slot: a request waiting for an extension holds what it took,
    // and a slot held while waiting for credits would refuse others `offer_at_capacity`.
    let credits = false;
    let slot = false;
    try {
      credits = await acquire(permitPool, input.maximumCredits, (need, want) =>
        store.takePermit({
          holder: epoch.holder,
          permitId,
          need,
          want,
          deposit: input.deposit,
          chainSettled: input.chainSettled,
        }),
      );
      if (!credits) return { ok: false, reason: "insufficient_credits" };
      slot = await acquire(offerPool, 1n, async (need, want) =>
        BigInt(
          await store.takeOffer({
            holder: epoch.holder,
            offerId: offerPool.id,
            need: Number(need),
            want: Number(want),
            maxConcurrency: input.maxConcurrency,
          }),
        ),
      );
    } catch (error) {
      throw error instanceof GatewayError ? error : unavailable(error);
    } finally {
      if (credits && !slot) release(permitPool, input.maximumCredits);
    }
    if (!slot) return { ok: false, reason: "offer_at_capacity" };
    if (revoked.has(permitId)) {
      release(permitPool, input.maximumCredits);
      release(offerPool, 1n);
      throw permitClosing(input.permitId);
    }
    const record: LeasedRecord = {
      requestId: input.requestId,
      apiKeyId: input.apiKeyId,
      holder: epoch.holder,
      model: input.model,
      modelId: input.modelId,
      offerId: input.offerId,
      permitId: input.permitId,
      quoteId: input.quoteId,
      stream: input.stream,
      maximumCredits: input.maximumCredits,
      tariffVersion: input.tariffVersion,
      inputTokens: input.inputTokens,
      authorizationId: input.authorizationId,
    };
    const open: OpenState = { sent: false, skip: false, streaming: false };
    // The record is best effort: a close writes the whole row when it is missing.
    const written = store.open(record, open).catch(() => undefined);
    epoch.open++;
    requests.set(input.requestId, {
      record,
      epoch,
      permitPool,
      offerPool,
      open,
      written,
      closing: undefined,
      slotHeld: true,
    });
    return { ok: true };
  };

  const finalize: Ledger["finalize"] = async (input) => {
    const r = requests.get(input.requestId);
    if (r === undefined) return fallback.finalize(input);
    // The provider is done with the request: its slot is free now, while its credits stay
    // held until the charge is committed (a slot is in-memory accounting inside the lease).
    if (r.slotHeld) {
      r.slotHeld = false;
      release(r.offerPool, 1n);
    }
    r.closing ??= (async () => {
      if (!r.open.sent) r.open.skip = true;
      else await r.written;
      return store.close({ ...input, record: r.record });
    })();
    let result: { finalized: boolean; creditsCharged: bigint };
    closeStarted(r.permitPool);
    try {
      result = await r.closing;
    } catch (error) {
      r.closing = undefined; // the outbox tries again; the close is exactly-once
      closeEnded(r.permitPool);
      throw error;
    }
    if (requests.delete(input.requestId)) {
      r.epoch.open--;
      // The charge left the lease in the same transaction; the rest of the maximum is free.
      r.permitPool.granted -= result.creditsCharged;
      release(r.permitPool, r.record.maximumCredits);
    }
    closeEnded(r.permitPool);
    return result;
  };

  const markStreaming: Ledger["markStreaming"] = async (requestId) => {
    const r = requests.get(requestId);
    if (r === undefined) return fallback.markStreaming(requestId);
    if (
      r.epoch.retired &&
      (r.epoch.forfeited ||
        (r.epoch.beatSentAt !== undefined && mono() > r.epoch.beatSentAt + staleMs))
    ) {
      return false; // the others may have released this epoch's leases: stop serving
    }
    if (!r.open.sent) {
      r.open.streaming = true;
      return true;
    }
    await r.written;
    await store.markStreaming(requestId);
    return true;
  };

  const switchOffer: Ledger["switchOffer"] = async (input) => {
    const r = requests.get(input.requestId);
    if (r === undefined) return fallback.switchOffer(input);
    if (r.epoch.retired) return false;
    const next = poolOf(r.epoch, "offer", input.offerId.toLowerCase() as Hex);
    const take = async (need: bigint, want: bigint) =>
      BigInt(
        await store.takeOffer({
          holder: r.epoch.holder,
          offerId: next.id,
          need: Number(need),
          want: Number(want),
          maxConcurrency: input.maxConcurrency,
        }),
      );
    if (next !== r.offerPool && !(await acquire(next, 1n, take))) return false;
    const growth = input.maximumCredits - r.record.maximumCredits;
    if (growth > 0n) {
      const grown = await acquire(r.permitPool, growth, (need, want) =>
        store.takePermit({
          holder: r.epoch.holder,
          permitId: r.permitPool.id,
          need,
          want,
          deposit: input.deposit,
          chainSettled: input.chainSettled,
        }),
      );
      if (!grown) {
        if (next !== r.offerPool) release(next, 1n);
        return false;
      }
    } else if (growth < 0n) {
      release(r.permitPool, -growth);
    }
    if (next !== r.offerPool) release(r.offerPool, 1n);
    r.offerPool = next;
    r.record.offerId = input.offerId;
    r.record.maximumCredits = input.maximumCredits;
    r.record.tariffVersion = input.tariffVersion;
    return true;
  };

  /**
   * A request reserved at the database one by one (a durable or a capped one) is refused only
   * when the database refuses it with nothing idle in a lease to cover it: on
   * `offer_at_capacity` or `insufficient_credits` this process's idle part of the offer (the
   * permit) goes back, the other processes are asked for theirs (a recall), and the database is
   * asked once more. Without it, slots and credits leased to a process and idle for up to
   * LEASE_IDLE_MS would refuse it while the offer had room (issue 28: a cap admits "no false
   * refusals"). A refused reservation left nothing behind (its transaction rolled back), so
   * asking again is the same request asking again.
   */
  const reservePerRequest: Ledger["reserve"] = async (input) => {
    const first = await fallback.reserve(input);
    if (
      first.ok ||
      (first.reason !== "offer_at_capacity" && first.reason !== "insufficient_credits")
    )
      return first;
    const key =
      first.reason === "offer_at_capacity"
        ? `offer:${input.offerId.toLowerCase()}`
        : `permit:${input.permitId.toLowerCase()}`;
    const gaveBack = await returns.giveBackIdle(key);
    if (signals !== undefined) await signals.recall(key);
    else if (!gaveBack) return first;
    return fallback.reserve(input);
  };

  signals?.onRecall((key) => void returns.answerRecall(key));

  const tick = async (): Promise<void> => {
    const now = mono();
    // The current epoch, and every retired one while it holds anything: a stream still running
    // on a retired epoch (or a close waiting in the outbox) keeps it alive for the orphan rule.
    const beats: Promise<void>[] = [];
    for (const epoch of epochs.all) {
      const due = epoch.beatSentAt !== undefined && now - epoch.beatSentAt >= heartbeatMs;
      if (due && (epoch === epochs.current || epochs.holds(epoch))) {
        beats.push(epochs.beat(epoch).catch(() => undefined));
      }
    }
    await Promise.all(beats);
    const nowSeconds = (options.permitClock ?? options.clock)();
    const work: Promise<void>[] = [];
    for (const epoch of epochs.all) {
      for (const [key, pool] of epoch.pools) {
        pool.recent = pool.admittedInWindow;
        pool.admittedInWindow = 0n;
        if (pool.busy || pool.queue.length > 0) continue;
        const ended =
          epoch.retired ||
          (pool.kind === "permit" &&
            (revoked.has(pool.id) ||
              (pool.expiresAt !== undefined && pool.expiresAt <= nowSeconds)));
        const idle = now - pool.lastActive >= idleMs;
        if (pool.used === 0n && (ended || idle)) {
          if (pool.granted > 0n || pool.dirty) work.push(returns.giveBack(pool, true));
          // Forgotten only when it holds nothing and nothing uses it (one pool per lease row).
          else if (ended || now - pool.lastActive >= 60_000) epoch.pools.delete(key);
        } else if (ended && pool.granted > pool.used) {
          work.push(returns.giveBack(pool, false));
        }
      }
    }
    await Promise.allSettled(work);
    epochs.prune();
  };

  return {
    reserve,
    finalize,
    // A request admitted here is closed through its lease; any other reservation is the
    // per-request ledger's.
    voidReservation: async (reservation, close) =>
      requests.has(reservation.requestId) || fallback.voidReservation === undefined
        ? finalize(close)
        : fallback.voidReservation(reservation, close),
    markStreaming,
    switchOffer,
    recordOfferFlag: (input) => fallback.recordOfferFlag(input),
    whenWritten: (requestId) => requests.get(requestId)?.written ?? Promise.resolve(),
    revokePermit(permitId) {
      const id = permitId.toLowerCase() as Hex;
      revoked.add(id);
      for (const epoch of epochs.all) {
        const pool = epoch.pools.get(`permit:${id}`);
        if (pool === undefined) continue;
        rejectAll(pool, permitClosing(permitId));
      }
      void tick();
    },
    tick: () => (ticking ??= tick().finally(() => (ticking = undefined))),
    start() {
      if (timer !== undefined) return;
      timer = setInterval(() => {
        ticking ??= tick()
          .catch(() => undefined)
          .finally(() => (ticking = undefined));
      }, tickMs);
      timer.unref();
    },
    async stop() {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
      await ticking;
      for (const epoch of epochs.all) epoch.retired = true;
      await tick();
    },
    held() {
      const permits = new Map<Hex, bigint>();
      const offers = new Map<Hex, bigint>();
      for (const epoch of epochs.all) {
        for (const pool of epoch.pools.values()) {
          const map = pool.kind === "permit" ? permits : offers;
          map.set(pool.id, (map.get(pool.id) ?? 0n) + pool.granted);
        }
      }
      return { permits, offers, holder: epochs.current.holder };
    },
  };
}
