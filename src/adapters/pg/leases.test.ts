import type { Hex } from "viem";
import { afterAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { hex32, NOW } from "../../../test/helpers/ledger.js";
import type { LeaseStore } from "../../domain/leases/store.js";
import { createLeasedLedger, type LeasedLedger } from "../../domain/leases/leases.js";
import type { Ledger } from "../../domain/chat/ports.js";
import { GatewayError } from "../../domain/errors.js";
import { createPgLeaseStore, releaseOrphanedLeases } from "./leases.js";
import * as ledger from "./ledger/index.js";
import { getRequest } from "./requests.js";

const MAX = 1_000n;

describe("reservation leases (migration 010, domain/chat/leases.ts)", () => {
  const test = useTestDatabase();
  const started: LeasedLedger[] = [];

  afterAll(async () => {
    for (const l of started) await l.stop().catch(() => undefined);
  });

  /** A process's leased ledger on the test database, with a clock the test moves. */
  function processLedger(
    name: string,
    wrap: (s: LeaseStore) => LeaseStore = (s) => s,
    staleAfterSeconds = 60,
  ) {
    const pool = test.db.pool;
    const clock = { ms: 0 };
    const fallback: Ledger = {
      reserve: (input) => ledger.reserve(pool, { ...input, instanceId: name }),
      markStreaming: (id) => ledger.markStreaming(pool, id),
      finalize: (input) => ledger.finalize(pool, input),
      switchOffer: (input) => ledger.switchOffer(pool, input),
      recordOfferFlag: (input) => ledger.recordOfferFlag(pool, input),
    };
    const leases = createLeasedLedger({
      store: wrap(createPgLeaseStore(pool)),
      fallback,
      instanceId: name,
      clock: () => NOW,
      monotonicMs: () => clock.ms,
      staleAfterSeconds,
    });
    started.push(leases);
    return { leases, clock };
  }

  function request(permitId: Hex, offerId: Hex, deposit: bigint) {
    return {
      requestId: hex32(),
      apiKeyId: "key_a",
      model: "org/model",
      modelId: hex32(),
      offerId,
      permitId,
      quoteId: hex32(),
      stream: false,
      maximumCredits: MAX,
      tariffVersion: 1n,
      inputTokens: 10n,
      deposit,
      chainSettled: 0n,
      maxConcurrency: 100,
      now: NOW,
    };
  }

  const close = (requestId: Hex, creditsCharged: bigint) => ({
    requestId,
    status: "completed" as const,
    inputTokens: 10n,
    outputTokens: 20n,
    creditsCharged,
    billing: "billed" as const,
    usageSource: "provider" as const,
    now: NOW + 1,
  });

  async function state(permitId: Hex, offerId: Hex) {
    const q = async (sql: string, id: Hex) =>
      (await test.db.pool.query<{ v: string | null }>(sql, [id.toLowerCase()])).rows[0]?.v ?? "0";
    return {
      ledger: await ledger.permitLedger(test.db.pool, permitId),
      leased: BigInt(
        await q("SELECT sum(credits)::text AS v FROM permit_leases WHERE permit_id = $1", permitId),
      ),
      inFlight: Number(
        await q("SELECT in_flight::text AS v FROM offer_loads WHERE offer_id = $1", offerId),
      ),
      slots: Number(
        await q("SELECT sum(slots)::text AS v FROM offer_leases WHERE offer_id = $1", offerId),
      ),
    };
  }

  async function record(id: Hex) {
    const { rows } = await test.db.pool.query<{
      status: string;
      credits_charged: string | null;
      billing: string | null;
      leased: boolean;
    }>("SELECT status, credits_charged, billing, leased FROM inference_requests WHERE id = $1", [
      id,
    ]);
    return rows[0];
  }

  it("admits against a lease, charges through it in batches, and gives it back when idle", async () => {
    const { leases, clock } = processLedger("gw_a");
    const [permitId, offerId] = [hex32(), hex32()];
    const ids: Hex[] = [];
    for (let i = 0; i < 3; i++) {
      const r = request(permitId, offerId, 10_000n);
      expect(await leases.reserve(r)).toEqual({ ok: true });
      ids.push(r.requestId);
    }
    let s = await state(permitId, offerId);
    // Leases count among the reservations: the ledger holds exactly what the leases hold.
    expect(s.ledger.reserved).toBe(s.leased);
    expect(s.leased).toBeGreaterThanOrEqual(3n * MAX);
    expect(s.inFlight).toBe(s.slots);
    for (const id of ids) {
      expect(await leases.finalize(close(id, 400n))).toEqual({
        finalized: true,
        creditsCharged: 400n,
      });
      // Exactly once: a second close changes nothing.
      expect(await leases.finalize(close(id, 400n))).toMatchObject({ creditsCharged: 400n });
      expect(await record(id)).toMatchObject({
        status: "completed",
        credits_charged: "400",
        leased: true,
      });
    }
    s = await state(permitId, offerId);
    expect(s.ledger.charged).toBe(1_200n);
    expect(s.ledger.reserved).toBe(s.leased);
    clock.ms += 1_500;
    await leases.tick();
    s = await state(permitId, offerId);
    expect(s).toMatchObject({ leased: 0n, inFlight: 0, slots: 0 });
    expect(s.ledger.reserved).toBe(0n);
    expect(s.ledger.charged).toBe(1_200n);
  });

  /**
   * A store whose give-backs take 300 ms: the first close's freed credits go back at once (the
   * permit is scarce), and the tick after the second close must wait for that give-back rather
   * than skip the busy pool (CI on a loaded machine: the other process's request was refused).
   */
  const slowReturns = (store: LeaseStore): LeaseStore => ({
    ...store,
    returnPermit: async (holder, permitId, credits) => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      return store.returnPermit(holder, permitId, credits);
    },
  });

  it.each([
    ["a prompt database", "p", (store: LeaseStore) => store],
    ["slow give-backs", "s", slowReturns],
  ])(
    "refuses only when the database refuses to extend, and never admits past the deposit (%s)",
    async (_name, tag, wrap) => {
      const a = processLedger(`gw_b1${tag}`, wrap);
      const b = processLedger(`gw_b2${tag}`);
      const [permitId, offerId] = [hex32(), hex32()];
      const deposit = 3n * MAX;
      const held: Hex[] = [];
      for (const r of [request(permitId, offerId, deposit), request(permitId, offerId, deposit)]) {
        expect(await a.leases.reserve(r)).toEqual({ ok: true });
        held.push(r.requestId);
      }
      const third = request(permitId, offerId, deposit);
      expect(await b.leases.reserve(third)).toEqual({ ok: true });
      // Both processes' leases now cover the deposit: the next request of either is refused.
      expect(await b.leases.reserve(request(permitId, offerId, deposit))).toEqual({
        ok: false,
        reason: "insufficient_credits",
      });
      expect(await a.leases.reserve(request(permitId, offerId, deposit))).toEqual({
        ok: false,
        reason: "insufficient_credits",
      });
      let s = await state(permitId, offerId);
      expect(s.ledger.reserved + s.ledger.charged).toBeLessThanOrEqual(deposit);
      // A's requests end void and its lease goes back: B can use those credits now.
      for (const id of held) await a.leases.finalize({ ...close(id, 0n), billing: "void" });
      a.clock.ms += 1_500;
      await a.leases.tick();
      expect((await state(permitId, offerId)).leased).toBe(MAX);
      expect(await b.leases.reserve(request(permitId, offerId, deposit))).toEqual({ ok: true });
      expect(await b.leases.reserve(request(permitId, offerId, deposit))).toEqual({ ok: true });
      s = await state(permitId, offerId);
      expect(s.ledger.reserved).toBe(deposit);
      expect(s.leased).toBe(deposit);
    },
  );

  it("admits nothing on a revoked (closing) permit and gives back its free credits at once", async () => {
    const { leases, clock } = processLedger("gw_c");
    const [permitId, offerId] = [hex32(), hex32()];
    const first = request(permitId, offerId, 100n * MAX);
    // A busy permit: a larger lease (headroom from the recent demand).
    expect(await leases.reserve(first)).toEqual({ ok: true });
    await leases.tick();
    leases.revokePermit(permitId);
    await expect(leases.reserve(request(permitId, offerId, 100n * MAX))).rejects.toMatchObject({
      code: "permit_closing",
    });
    await leases.tick();
    let s = await state(permitId, offerId);
    expect(s.leased).toBe(MAX); // only what the request in flight holds
    await leases.finalize(close(first.requestId, 250n));
    clock.ms += 10;
    await leases.tick();
    s = await state(permitId, offerId);
    expect(s.leased).toBe(0n);
    expect(s.ledger).toMatchObject({ reserved: 0n, charged: 250n });
  });

  it("closes a dead holder's open records before it gives its leases back (those the orphan sweep left)", async () => {
    const { leases } = processLedger("gw_e");
    const [permitId, offerId] = [hex32(), hex32()];
    const r = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(r)).toEqual({ ok: true });
    await leases.whenWritten(r.requestId);
    // No reconcileOrphans first (as when its limit left some): the release closes the record.
    const later = (await ledger.databaseNow(test.db.pool)) + 120;
    expect(
      await releaseOrphanedLeases(test.db.pool, { staleAfterSeconds: 60, now: later }),
    ).toBeGreaterThanOrEqual(2);
    expect(await record(r.requestId)).toMatchObject({
      status: "failed",
      credits_charged: "0",
      billing: "void",
    });
    const s = await state(permitId, offerId);
    expect(s).toMatchObject({ leased: 0n, inFlight: 0, slots: 0 });
    expect(s.ledger.reserved).toBe(0n);
    expect(await leases.finalize(close(r.requestId, 500n))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
  });

  it("releases a dead holder's leases by the orphan rule; a close after that charges nothing", async () => {
    const { leases } = processLedger("gw_d");
    const [permitId, offerId] = [hex32(), hex32()];
    const r = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(r)).toEqual({ ok: true });
    await leases.whenWritten(r.requestId);
    // Its record was created on the database's clock, the one the rule compares with
    // heartbeats, not on the process's (NOW, years behind it).
    const { rows } = await test.db.pool.query<{ created_at: string }>(
      "SELECT created_at FROM inference_requests WHERE id = $1",
      [r.requestId],
    );
    const created = Number(rows[0]!.created_at);
    expect(Math.abs(created - (await ledger.databaseNow(test.db.pool)))).toBeLessThanOrEqual(2);
    // Not yet stale: nothing happens.
    expect(await releaseOrphanedLeases(test.db.pool, { staleAfterSeconds: 60 })).toBe(0);
    const later = (await ledger.databaseNow(test.db.pool)) + 120;
    expect(
      await ledger.reconcileOrphans(test.db.pool, { staleAfterSeconds: 60, now: later }),
    ).toBeGreaterThanOrEqual(1);
    // This test's two leases, and whatever the other tests' processes still hold (all "dead").
    expect(
      await releaseOrphanedLeases(test.db.pool, { staleAfterSeconds: 60, now: later }),
    ).toBeGreaterThanOrEqual(2);
    let s = await state(permitId, offerId);
    expect(s).toMatchObject({ leased: 0n, inFlight: 0, slots: 0 });
    expect(s.ledger.reserved).toBe(0n);
    // The paused process comes back and closes its request: already void, nothing charged.
    expect(await leases.finalize(close(r.requestId, 500n))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
    s = await state(permitId, offerId);
    expect(s.ledger).toMatchObject({ reserved: 0n, charged: 0n });
    expect(await record(r.requestId)).toMatchObject({ status: "failed", billing: "void" });
  });

  it("writes the whole record at the close when its first write was lost", async () => {
    const { leases } = processLedger("gw_e", (store) => ({
      ...store,
      open: () => Promise.reject(new Error("connection lost")),
    }));
    const [permitId, offerId] = [hex32(), hex32()];
    const r = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(r)).toEqual({ ok: true });
    await leases.whenWritten(r.requestId);
    expect(await record(r.requestId)).toBeUndefined();
    expect(await leases.finalize(close(r.requestId, 300n))).toEqual({
      finalized: true,
      creditsCharged: 300n,
    });
    expect(await record(r.requestId)).toMatchObject({
      status: "completed",
      credits_charged: "300",
    });
    expect((await state(permitId, offerId)).ledger.charged).toBe(300n);
  });

  it("records a leased close's usage details, whether its record was written first or not", async () => {
    const details = async (id: Hex) =>
      (
        await test.db.pool.query<{ c: string; r: string }>(
          "SELECT cached_input_tokens::text AS c, reasoning_tokens::text AS r FROM inference_requests WHERE id = $1",
          [id],
        )
      ).rows[0];
    for (const lost of [false, true]) {
      const { leases } = processLedger(
        lost ? "gw_usage_lost" : "gw_usage",
        lost ? (store) => ({ ...store, open: () => Promise.reject(new Error("lost")) }) : undefined,
      );
      const [permitId, offerId] = [hex32(), hex32()];
      const r = request(permitId, offerId, 10n * MAX);
      const plain = request(permitId, offerId, 10n * MAX);
      for (const x of [r, plain]) expect(await leases.reserve(x)).toEqual({ ok: true });
      for (const x of [r, plain]) await leases.whenWritten(x.requestId);
      // The UPDATE of a written record, or the INSERT of one whose write was lost.
      if (lost) expect(await record(r.requestId)).toBeUndefined();
      else expect(await record(r.requestId)).toMatchObject({ status: "pending" });
      await Promise.all([
        leases.finalize({
          ...close(r.requestId, 300n),
          cachedInputTokens: 4n,
          reasoningTokens: 9n,
        }),
        leases.finalize(close(plain.requestId, 300n)),
      ]);
      expect(await record(r.requestId)).toMatchObject({ status: "completed", leased: true });
      expect(await details(r.requestId)).toEqual({ c: "4", r: "9" });
      expect(await details(plain.requestId)).toEqual({ c: "0", r: "0" });
    }
  });

  it("records a leased close's claim and count, whether its record was written first or not", async () => {
    const figures = (input: bigint, output: bigint) => ({
      inputTokens: input,
      outputTokens: output,
      cachedInputTokens: 3n,
      reasoningTokens: 4n,
    });
    for (const lost of [false, true]) {
      const { leases } = processLedger(
        lost ? "gw_claims_lost" : "gw_claims",
        lost ? (store) => ({ ...store, open: () => Promise.reject(new Error("lost")) }) : undefined,
      );
      const [permitId, offerId] = [hex32(), hex32()];
      const r = request(permitId, offerId, 10n * MAX);
      const plain = request(permitId, offerId, 10n * MAX);
      for (const x of [r, plain]) expect(await leases.reserve(x)).toEqual({ ok: true });
      for (const x of [r, plain]) await leases.whenWritten(x.requestId);
      // The UPDATE of a written record, or the INSERT of one whose write was lost.
      if (lost) expect(await record(r.requestId)).toBeUndefined();
      else expect(await record(r.requestId)).toMatchObject({ status: "pending" });
      await Promise.all([
        leases.finalize({
          ...close(r.requestId, 300n),
          claimed: figures(3_550n, 2_000n),
          counted: figures(12n, 5n),
        }),
        leases.finalize(close(plain.requestId, 300n)),
      ]);
      const read = async (id: Hex) => {
        const got = await getRequest(test.db.pool, id, "key_a");
        return [got?.claimed, got?.counted];
      };
      expect(await read(r.requestId)).toEqual([figures(3_550n, 2_000n), figures(12n, 5n)]);
      expect(await read(plain.requestId)).toEqual([null, null]);
    }
  });

  it("stops admitting against an epoch the others could take for dead, and starts a new one", async () => {
    const { leases, clock } = processLedger("gw_f");
    const [permitId, offerId] = [hex32(), hex32()];
    const first = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(first)).toEqual({ ok: true });
    const before = leases.held().holder;
    // No heartbeat for 50 s (of a 60 s orphan window): the epoch is retired.
    clock.ms += 50_000;
    const second = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(second)).toEqual({ ok: true });
    expect(leases.held().holder).not.toBe(before);
    for (const r of [first, second]) await leases.finalize(close(r.requestId, 100n));
    clock.ms += 1_500;
    await leases.tick();
    const s = await state(permitId, offerId);
    expect(s).toMatchObject({ leased: 0n, inFlight: 0, slots: 0 });
    expect(s.ledger).toMatchObject({ reserved: 0n, charged: 200n });
  });

  it("keeps the per-request reservation for durable requests", async () => {
    const { leases } = processLedger("gw_g");
    const [permitId, offerId] = [hex32(), hex32()];
    const r = { ...request(permitId, offerId, 10n * MAX), durable: true };
    // The per-request path consumes the stored quote first; there is none, so it answers as
    // gw_reserve does. A lease never answers quote_used.
    expect(await leases.reserve(r)).toEqual({ ok: false, reason: "quote_used" });
    expect(leases.held().permits.size).toBe(0);
  });

  it("keeps the per-request reservation for a request capped by its authorization, and records a leased request's authorization", async () => {
    const { leases } = processLedger("gw_caps");
    const [permitId, offerId] = [hex32(), hex32()];
    const capped = {
      ...request(permitId, offerId, 10n * MAX),
      authorizationId: "pauth_x",
      capped: true,
    };
    // The per-request path (as for a durable request): no stored quote, so gw_reserve's answer.
    expect(await leases.reserve(capped)).toEqual({ ok: false, reason: "quote_used" });
    expect(leases.held().permits.size).toBe(0);

    const plain = { ...request(permitId, offerId, 10n * MAX), authorizationId: "pauth_y" };
    expect(await leases.reserve(plain)).toEqual({ ok: true });
    expect(leases.held().permits.get(permitId)).toBeGreaterThanOrEqual(MAX);
    await leases.whenWritten(plain.requestId);
    const written = async (id: Hex) =>
      (
        await test.db.pool.query<{ authorization_id: string | null; leased: boolean }>(
          "SELECT authorization_id, leased FROM inference_requests WHERE id = $1",
          [id],
        )
      ).rows[0];
    expect(await written(plain.requestId)).toEqual({ authorization_id: "pauth_y", leased: true });
    expect(await leases.finalize(close(plain.requestId, 300n))).toEqual({
      finalized: true,
      creditsCharged: 300n,
    });
    // Closed at once: recorded by whichever writes its row (the record's batch, or the close
    // when the record was not sent yet).
    const unsent = { ...request(permitId, offerId, 10n * MAX), authorizationId: "pauth_z" };
    expect(await leases.reserve(unsent)).toEqual({ ok: true });
    await leases.finalize(close(unsent.requestId, 0n));
    expect(await written(unsent.requestId)).toMatchObject({ authorization_id: "pauth_z" });
  });

  it("maps a lease failure to database_unavailable without a request", async () => {
    const { leases } = processLedger("gw_h", (store) => ({
      ...store,
      takePermit: () => Promise.reject(new Error("connection lost")),
    }));
    const err = await leases.reserve(request(hex32(), hex32(), 10n * MAX)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect(err).toMatchObject({ code: "database_unavailable", sent: false });
  });

  it("admits nothing against credits being given back (the request extends instead)", async () => {
    let gate: (() => void) | undefined;
    let takes = 0;
    const { leases, clock } = processLedger("gw_i", (store) => ({
      ...store,
      takePermit: (r) => {
        takes++;
        return store.takePermit(r);
      },
      returnPermit: async (...args) => {
        if (gate === undefined) await new Promise<void>((resolve) => (gate = resolve));
        return store.returnPermit(...args);
      },
    }));
    const [permitId, offerId] = [hex32(), hex32()];
    const first = request(permitId, offerId, 10n * MAX);
    expect(await leases.reserve(first)).toEqual({ ok: true });
    await leases.finalize(close(first.requestId, 100n));
    clock.ms += 1_500;
    const ticking = leases.tick(); // gives the idle lease back; held at the gate
    await new Promise((r) => setTimeout(r, 20));
    expect(gate).toBeDefined();
    const second = leases.reserve(request(permitId, offerId, 10n * MAX));
    await new Promise((r) => setTimeout(r, 20));
    gate!();
    await ticking;
    expect(await second).toEqual({ ok: true });
    expect(takes).toBe(2);
    const s = await state(permitId, offerId);
    expect(s.ledger.reserved).toBe(s.leased);
    expect(s.leased).toBeGreaterThanOrEqual(MAX);
  });

  it("frees a request's offer slot when its close starts, before the charge commits", async () => {
    let gate: (() => void) | undefined;
    const { leases } = processLedger("gw_j", (store) => ({
      ...store,
      close: async (c) => {
        if (gate === undefined) await new Promise<void>((resolve) => (gate = resolve));
        return store.close(c);
      },
    }));
    const [permitId, offerId] = [hex32(), hex32()];
    const one = { ...request(permitId, offerId, 10n * MAX), maxConcurrency: 1 };
    expect(await leases.reserve(one)).toEqual({ ok: true });
    const closing = leases.finalize(close(one.requestId, 100n));
    await new Promise((r) => setTimeout(r, 20));
    expect(gate).toBeDefined(); // the charge is not committed yet ...
    const two = { ...request(permitId, offerId, 10n * MAX), maxConcurrency: 1 };
    expect(await leases.reserve(two)).toEqual({ ok: true }); // ... but the slot is free
    gate!();
    expect(await closing).toEqual({ finalized: true, creditsCharged: 100n });
    const s = await state(permitId, offerId);
    expect(s.inFlight).toBe(1);
    expect(s.ledger.reserved).toBe(s.leased);
  });

  /** The holder's lease rows and its instance row (whether it has heartbeated at all). */
  async function holderRows(holder: string) {
    const q = async (sql: string) =>
      (await test.db.pool.query<{ n: number }>(sql, [holder])).rows[0]!.n;
    return {
      leases: await q(
        `SELECT ((SELECT count(*) FROM permit_leases WHERE holder = $1)
               + (SELECT count(*) FROM offer_leases WHERE holder = $1))::int AS n`,
      ),
      instance: await q("SELECT count(*)::int AS n FROM gateway_instances WHERE instance_id = $1"),
    };
  }

  it("writes a new epoch's instance row before it takes a lease, even while the old epoch's heartbeat hangs", async () => {
    // The first epoch's heartbeats hang once `hanging` is set (a slow statement, a lock wait).
    let hanging = false;
    let resume: (() => void) | undefined;
    const { leases, clock } = processLedger("gw_k", (store) => ({
      ...store,
      heartbeat: async (holder) => {
        if (hanging && holder === "gw_k/lease-1") {
          await new Promise<void>((resolve) => (resume = resolve));
        }
        return store.heartbeat(holder);
      },
    }));
    const first = request(hex32(), hex32(), 10n * MAX);
    expect(await leases.reserve(first)).toEqual({ ok: true });
    await leases.finalize(close(first.requestId, 100n));

    // A heartbeat of the first epoch is due and hangs; meanwhile it lapses (3/4 of the window
    // without a heartbeat), so the next admission starts a second epoch.
    hanging = true;
    clock.ms += 5_000;
    const ticking = leases.tick();
    await new Promise((r) => setTimeout(r, 20));
    expect(resume).toBeDefined();
    clock.ms += 45_000;
    const [permitId, offerId] = [hex32(), hex32()];
    const second = request(permitId, offerId, 10n * MAX);
    const admitting = leases.reserve(second);
    await new Promise((r) => setTimeout(r, 50));
    hanging = false;
    resume!();
    await ticking;
    expect(await admitting).toEqual({ ok: true });
    expect(leases.held().holder).toBe("gw_k/lease-2");
    expect(await holderRows("gw_k/lease-2")).toEqual({ leases: 2, instance: 1 });

    // Another process's orphan rule right after: the new epoch is alive, its leases stay.
    await releaseOrphanedLeases(test.db.pool, { staleAfterSeconds: 60 });
    expect(await holderRows("gw_k/lease-2")).toEqual({ leases: 2, instance: 1 });
    const s = await state(permitId, offerId);
    expect(s.leased).toBeGreaterThanOrEqual(MAX);
    expect(s.ledger.reserved).toBe(s.leased);
    expect(await leases.finalize(close(second.requestId, 300n))).toEqual({
      finalized: true,
      creditsCharged: 300n,
    });
  });

  it("heartbeats a retired epoch while a request on it runs: across several orphan windows it is not voided, and it is charged", async () => {
    // A two-second orphan window, on the database's real clock; the process's clock is moved
    // by the test (heartbeats every 333 ms, admission stops 1.5 s after the last one).
    const { leases, clock } = processLedger("gw_l", (s) => s, 2);
    const [permitId, offerId] = [hex32(), hex32()];
    const long = { ...request(permitId, offerId, 100n * MAX), stream: true };
    expect(await leases.reserve(long)).toEqual({ ok: true });
    await leases.whenWritten(long.requestId);
    expect(await leases.markStreaming(long.requestId)).toBe(true);

    // A brownout: no heartbeat for 3/4 of the window. The next admission retires the first
    // epoch (the long stream still runs on it) and starts a second one.
    clock.ms += 1_600;
    const short = request(permitId, offerId, 100n * MAX);
    expect(await leases.reserve(short)).toEqual({ ok: true });
    expect(leases.held().holder).toBe("gw_l/lease-2");
    expect(await leases.finalize(close(short.requestId, 200n))).toEqual({
      finalized: true,
      creditsCharged: 200n,
    });

    // The database is healthy again. For three orphan windows another process runs the
    // orphan rule (requests, then leases) every 200 ms while this process ticks.
    const until = Date.now() + 6_500;
    while (Date.now() < until) {
      await new Promise((r) => setTimeout(r, 200));
      clock.ms += 200;
      await leases.tick();
      await ledger.reconcileOrphans(test.db.pool, { staleAfterSeconds: 2 });
      await releaseOrphanedLeases(test.db.pool, { staleAfterSeconds: 2 });
    }
    expect(await record(long.requestId)).toMatchObject({ status: "streaming" });
    expect((await holderRows("gw_l/lease-1")).leases).toBeGreaterThanOrEqual(1);

    // The stream ends: charged as its client is told, once.
    expect(await leases.finalize({ ...close(long.requestId, 700n), now: NOW + 10 })).toEqual({
      finalized: true,
      creditsCharged: 700n,
    });
    expect(await record(long.requestId)).toMatchObject({
      status: "completed",
      credits_charged: "700",
      billing: "billed",
    });
    // Holding nothing now, the retired epoch gives its leases back and is heartbeated no more.
    clock.ms += 10;
    await leases.tick();
    expect((await holderRows("gw_l/lease-1")).leases).toBe(0);
    const beatAt = async () =>
      (
        await test.db.pool.query<{ at: string }>(
          "SELECT heartbeat_at::text AS at FROM gateway_instances WHERE instance_id = $1",
          ["gw_l/lease-1"],
        )
      ).rows[0]!.at;
    const last = await beatAt();
    await new Promise((r) => setTimeout(r, 1_100));
    clock.ms += 1_100;
    await leases.tick();
    expect(await beatAt()).toBe(last);
    const s = await state(permitId, offerId);
    expect(s.ledger.charged).toBe(900n);
    expect(s.ledger.reserved).toBe(s.leased);
  });

  it("retires an epoch whose heartbeat came back too late, and stops a stream on it once it may have been taken for dead", async () => {
    let failing = false;
    const { leases, clock } = processLedger("gw_m", (store) => ({
      ...store,
      heartbeat: async (holder) => {
        if (failing) throw new Error("Connection terminated unexpectedly");
        return store.heartbeat(holder);
      },
    }));
    const [permitId, offerId] = [hex32(), hex32()];
    const first = { ...request(permitId, offerId, 100n * MAX), stream: true };
    expect(await leases.reserve(first)).toEqual({ ok: true });
    await leases.whenWritten(first.requestId);

    // The heartbeat fails for more than 3/4 of the window, then succeeds: admission must not
    // go on against this epoch (the others may be about to release its leases).
    failing = true;
    clock.ms += 5_000;
    await leases.tick();
    clock.ms += 46_000;
    failing = false;
    await leases.tick();
    const second = request(permitId, offerId, 100n * MAX);
    expect(await leases.reserve(second)).toEqual({ ok: true });
    expect(leases.held().holder).toBe("gw_m/lease-2");
    // Not yet a full window without a heartbeat: the stream on the retired epoch is served.
    expect(await leases.markStreaming(first.requestId)).toBe(true);

    // A full window without a heartbeat, then one: the others may have voided the epoch's
    // requests meanwhile, so a request on it that has not streamed yet stops.
    const third = { ...request(permitId, offerId, 100n * MAX), stream: true };
    expect(await leases.reserve(third)).toEqual({ ok: true });
    failing = true;
    clock.ms += 5_000;
    await leases.tick();
    clock.ms += 61_000;
    failing = false;
    await leases.tick();
    expect(await leases.markStreaming(third.requestId)).toBe(false);
    expect(leases.held().holder).toBe("gw_m/lease-2");
    for (const r of [first, second, third]) {
      await leases.finalize({ ...close(r.requestId, 0n), billing: "void" });
    }
  });
});
