import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import type { Epoch } from "./epochs.js";
import type { LeasedRecord, OpenState } from "./store.js";
import { permitClosing, poolOf, type LeaseState } from "./state.js";
import type { Ledger, ReserveInput, ReserveResult } from "../chat/ports.js";

/**
 * Admission through the leases (leases.ts): a request takes credits of its permit's lease and
 * a slot of its offer's, extending them at the database when they lack (pool.ts); a
 * durable or capped request is reserved one by one, and refused only when no idle lease could
 * cover it. Failover's switch to another offer moves the request's slot and resizes its credits.
 */

type SwitchInput = Parameters<Ledger["switchOffer"]>[0];

/** Admits a request against this process's leases (a durable or capped one: per request). */
export async function reserve(s: LeaseState, input: ReserveInput): Promise<ReserveResult> {
  // A request capped by its authorization's total or periodic cap reserves against it per request
  // (adapters/pg/ledger/index.ts, "Authorization caps"): a cap leased to one process would refuse
  // another's request while it sat idle here.
  if (input.durable === true || input.capped === true) return reservePerRequest(s, input);
  const permitId = input.permitId.toLowerCase() as Hex;
  if (s.revoked.has(permitId)) throw permitClosing(input.permitId);
  let epoch: Epoch;
  try {
    epoch = await s.epochs.admitting();
  } catch (error) {
    throw unavailable(error);
  }
  const offerPool = poolOf(s, epoch, "offer", input.offerId.toLowerCase() as Hex);
  const permitPool = poolOf(s, epoch, "permit", permitId);
  if (input.permitExpiresAt !== undefined) permitPool.expiresAt = input.permitExpiresAt;
  // Credits first, then the slot: a request waiting for an extension holds what it took,
  // and a slot held while waiting for credits would refuse others `offer_at_capacity`.
  let credits = false;
  let slot = false;
  try {
    credits = await s.pools.acquire(permitPool, input.maximumCredits, (need, want) =>
      s.store.takePermit({
        holder: epoch.holder,
        permitId,
        need,
        want,
        deposit: input.deposit,
        chainSettled: input.chainSettled,
      }),
    );
    if (!credits) return { ok: false, reason: "insufficient_credits" };
    slot = await s.pools.acquire(offerPool, 1n, async (need, want) =>
      BigInt(
        await s.store.takeOffer({
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
    if (credits && !slot) s.pools.release(permitPool, input.maximumCredits);
  }
  if (!slot) return { ok: false, reason: "offer_at_capacity" };
  if (s.revoked.has(permitId)) {
    s.pools.release(permitPool, input.maximumCredits);
    s.pools.release(offerPool, 1n);
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
  const written = s.store.open(record, open).catch(() => undefined);
  epoch.open++;
  s.requests.set(input.requestId, {
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
}

/** Failover before the first byte, inside the leases (a request not admitted here: the fallback's). */
export async function switchOffer(s: LeaseState, input: SwitchInput): Promise<boolean> {
  const r = s.requests.get(input.requestId);
  if (r === undefined) return s.fallback.switchOffer(input);
  if (r.epoch.retired) return false;
  const next = poolOf(s, r.epoch, "offer", input.offerId.toLowerCase() as Hex);
  const take = async (need: bigint, want: bigint) =>
    BigInt(
      await s.store.takeOffer({
        holder: r.epoch.holder,
        offerId: next.id,
        need: Number(need),
        want: Number(want),
        maxConcurrency: input.maxConcurrency,
      }),
    );
  if (next !== r.offerPool && !(await s.pools.acquire(next, 1n, take))) return false;
  const growth = input.maximumCredits - r.record.maximumCredits;
  if (growth > 0n) {
    const grown = await s.pools.acquire(r.permitPool, growth, (need, want) =>
      s.store.takePermit({
        holder: r.epoch.holder,
        permitId: r.permitPool.id,
        need,
        want,
        deposit: input.deposit,
        chainSettled: input.chainSettled,
      }),
    );
    if (!grown) {
      if (next !== r.offerPool) s.pools.release(next, 1n);
      return false;
    }
  } else if (growth < 0n) {
    s.pools.release(r.permitPool, -growth);
  }
  if (next !== r.offerPool) s.pools.release(r.offerPool, 1n);
  r.offerPool = next;
  r.record.offerId = input.offerId;
  r.record.maximumCredits = input.maximumCredits;
  r.record.tariffVersion = input.tariffVersion;
  return true;
}

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
async function reservePerRequest(s: LeaseState, input: ReserveInput): Promise<ReserveResult> {
  const first = await s.fallback.reserve(input);
  if (first.ok || (first.reason !== "offer_at_capacity" && first.reason !== "insufficient_credits"))
    return first;
  const key =
    first.reason === "offer_at_capacity"
      ? `offer:${input.offerId.toLowerCase()}`
      : `permit:${input.permitId.toLowerCase()}`;
  const gaveBack = await s.returns.giveBackIdle(key);
  if (s.signals !== undefined) await s.signals.recall(key);
  else if (!gaveBack) return first;
  return s.fallback.reserve(input);
}

/** A lease error: the request was not admitted (nothing of it reached the database). */
function unavailable(error: unknown): GatewayError & { sent: boolean } {
  return Object.assign(
    new GatewayError("database_unavailable", "the reservation lease could not be extended", {
      cause: error,
    }),
    { sent: false },
  );
}
