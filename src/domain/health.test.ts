import type { Hex } from "viem";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "../../test/helpers/fake-upstream.js";
import { useTestDatabase } from "../../test/helpers/db.js";
import {
  createPgEndpointHealthStore,
  getEndpointHealth,
  listRegisteredEndpoints,
  recordProbe,
  recordVerification,
} from "../adapters/pg/endpoint-health.js";
import type { Queryable } from "../adapters/pg/catalog.js";
import { excludeOffer, readUsageExclusions } from "../adapters/pg/offer-measurements.js";
import { upsertProviderEndpoint } from "../adapters/pg/registrations.js";
import { createUpstreamClient, type UpstreamClient } from "../adapters/upstream/http.js";
import { countingMaxTokens, createEndpointProber } from "../adapters/upstream/probe.js";
import { GatewayError } from "./errors.js";
import { createHealthMonitor } from "./health.js";
import { type EndpointSecret, type HealthMonitor, type HealthMonitorDeps } from "./health-types.js";

// Sealing is the lead's AES-GCM in production; any reversible encoding shows the flow here.
const seal = (endpoint: EndpointSecret): Buffer => Buffer.from(JSON.stringify(endpoint), "utf8");
const open = (_offerId: Hex, sealed: Buffer): EndpointSecret =>
  JSON.parse(sealed.toString("utf8")) as EndpointSecret;

const modelId = `0x${"11".repeat(32)}` as Hex;
const names = ["acme/llama", modelId];
const token = "tok-health-secret";

const test = useTestDatabase();
let db: Queryable;
let upstream: UpstreamClient;
let offerCounter = 0;
let now = 1_700_000_000;
const clock = () => now;
const fakes: FakeUpstream[] = [];
const monitors: HealthMonitor[] = [];
const logLines: string[] = [];
const logger = {
  info: (obj: object, msg?: string) => logLines.push(JSON.stringify({ ...obj, msg })),
  warn: (obj: object, msg?: string) => logLines.push(JSON.stringify({ ...obj, msg })),
};

beforeAll(async () => {
  db = test.db.pool;
  upstream = createUpstreamClient({ allowPrivate: true });
  await db.query(
    `INSERT INTO models (model_id, creator, credit_token, repository, revision, task, pool_id,
       position_token_id, status, indexed_block)
     VALUES ($1, $2, $2, 'acme/llama', 'main', 'chat', $1, 1, 'active', 1)`,
    [modelId, `0x${"22".repeat(20)}`],
  );
});

afterAll(async () => {
  await upstream?.close();
});

afterEach(async () => {
  await Promise.all(monitors.splice(0).map((m) => m.stop()));
  await Promise.all(fakes.splice(0).map((f) => f.stop()));
});

async function fake(opts: Parameters<typeof startFakeUpstream>[0] = {}): Promise<FakeUpstream> {
  const f = await startFakeUpstream({ models: ["acme/llama"], token, ...opts });
  fakes.push(f);
  return f;
}

/** A fresh offer with `endpoint` registered (rows written directly: registration is not ours). */
async function registeredOffer(endpoint: EndpointSecret): Promise<Hex> {
  const offerId = `0x${(++offerCounter).toString(16).padStart(64, "0")}` as Hex;
  const address = `0x${"33".repeat(20)}`;
  await db.query(
    `INSERT INTO offers (offer_id, model_id, owner, operator, payout, status, tariff_version,
       input_price_per_mtok, output_price_per_mtok, wake_fee, region, hardware, max_concurrency,
       capabilities, indexed_block)
     VALUES ($1, $2, $3, $3, $3, 'active', 1, 1, 1, 0, 'eu', 'gpu', 4, '{}', 1)`,
    [offerId, modelId, address],
  );
  await db.query(
    `INSERT INTO provider_endpoints (offer_id, operator, endpoint_sealed, registered_at)
     VALUES ($1, $2, $3, $4)`,
    [offerId, address, seal(endpoint), now],
  );
  return offerId;
}

function monitor(overrides: Partial<HealthMonitorDeps> = {}): HealthMonitor {
  const m = createHealthMonitor({
    store: createPgEndpointHealthStore(db),
    open,
    prober: createEndpointProber(upstream, { livenessTimeoutMs: 1_000, verifyTimeoutMs: 5_000 }),
    intervalMs: 60_000,
    concurrency: 4,
    staleMs: 30_000,
    verifyMinIntervalSeconds: 0,
    clock,
    logger,
    ...overrides,
  });
  monitors.push(m);
  return m;
}

describe("endpoint health store", () => {
  it("records probes monotonically and reads them back", async () => {
    const offerId = await registeredOffer({ url: "http://127.0.0.1:9/" });
    expect(await getEndpointHealth(db, offerId)).toEqual({
      offerId,
      registeredAt: now,
      running: undefined,
      checkedAt: undefined,
      verifiedAt: undefined,
      verificationExpiresAt: undefined,
      verificationError: undefined,
    });
    await recordProbe(db, offerId, true, now + 10);
    await recordProbe(db, offerId, false, now + 5); // older: ignored
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      running: true,
      checkedAt: now + 10,
    });
    // Offer ids compare in any hex case.
    await recordProbe(db, offerId.toUpperCase().replace("0X", "0x") as Hex, false, now + 11);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({ running: false });
    const listed = (await listRegisteredEndpoints(db)).find((e) => e.offerId === offerId);
    expect(listed).toEqual({
      offerId,
      sealed: seal({ url: "http://127.0.0.1:9/" }),
      checkedAt: now + 11,
    });
    expect(await getEndpointHealth(db, `0x${"ff".repeat(32)}`)).toBeUndefined();
  });

  it("records a verification only for the endpoint it checked", async () => {
    const offerId = await registeredOffer({ url: "http://127.0.0.1:9/" });
    const ok = { ok: true, verifiedAt: now, expiresAt: now + 60 } as const;
    expect(
      await recordVerification(db, offerId, ok, { sealed: seal({ url: "http://other/" }) }),
    ).toBe(false);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({ verifiedAt: undefined });
    expect(
      await recordVerification(db, offerId, ok, { sealed: seal({ url: "http://127.0.0.1:9/" }) }),
    ).toBe(true);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt: now,
      verificationExpiresAt: now + 60,
      verificationError: undefined,
    });
    // A transport failure leaves the verification standing; it is still the check that failed last.
    const unreachable = {
      ok: false,
      check: "endpoint_unreachable",
      message: "a one-token chat completion answered HTTP 429",
      transport: true,
      ranAt: now + 1,
    } as const;
    expect(await recordVerification(db, offerId, unreachable)).toBe(true);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt: now,
      verificationExpiresAt: now + 60,
      verificationError: "endpoint_unreachable",
    });
    const rejected = {
      ok: false,
      check: "usage_missing",
      message: "no usage",
      transport: false,
      ranAt: now + 2,
    } as const;
    expect(await recordVerification(db, offerId, rejected)).toBe(true);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt: undefined,
      verificationExpiresAt: undefined,
      verificationError: "usage_missing",
    });
  });

  it("keeps the features a run proved, those whose check got no answer, and clears them on a wrong answer", async () => {
    const offerId = await registeredOffer({ url: "http://127.0.0.1:9/" });
    const features = async () =>
      (
        await db.query<{ verified_features: string[] }>(
          "SELECT verified_features FROM provider_endpoints WHERE offer_id = $1",
          [offerId],
        )
      ).rows[0]?.verified_features;
    const ok = (proved: string[], unanswered: string[] = []) =>
      ({
        ok: true,
        verifiedAt: now,
        expiresAt: now + 60,
        features: proved,
        unanswered,
      }) as Parameters<typeof recordVerification>[2];
    expect(await features()).toEqual([]);
    await recordVerification(db, offerId, ok(["stream_usage", "tools", "json_schema"]));
    expect(await features()).toEqual(["json_schema", "stream_usage", "tools"]);
    // tools got no answer this time: it keeps its standing; json_schema answered wrongly.
    await recordVerification(db, offerId, ok(["stream_usage"], ["tools"]));
    expect(await features()).toEqual(["stream_usage", "tools"]);
    await recordVerification(db, offerId, {
      ok: false,
      check: "endpoint_unreachable",
      message: "timeout",
      transport: true,
      ranAt: now + 1,
    });
    expect(await features()).toEqual(["stream_usage", "tools"]);
    await recordVerification(db, offerId, {
      ok: false,
      check: "usage_missing",
      message: "no usage",
      transport: false,
      ranAt: now + 2,
    });
    expect(await features()).toEqual([]);
  });
});

describe("health monitor", () => {
  it("shows a stopped fake provider as not running after the next probe", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    expect(await m.probeAll()).toMatchObject({ running: expect.any(Number) as number });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({ running: true, checkedAt: now });

    await f.stop();
    now += 1;
    await m.probeAll();
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      running: false,
      checkedAt: now,
    });
  });

  it("notices a stopped provider within the probe interval when started", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor({ intervalMs: 100 });
    m.start();
    await vi.waitFor(async () => {
      expect(await getEndpointHealth(db, offerId)).toMatchObject({ running: true });
    });
    await f.stop();
    await vi.waitFor(
      async () => {
        expect(await getEndpointHealth(db, offerId)).toMatchObject({ running: false });
      },
      { timeout: 5_000 },
    );
    await m.stop();
  });

  it("probes with bounded concurrency", async () => {
    const f = await fake();
    const offers = await Promise.all(
      Array.from({ length: 6 }, () => registeredOffer({ url: f.url, token })),
    );
    let active = 0;
    let peak = 0;
    const prober = createEndpointProber(upstream);
    const m = monitor({
      concurrency: 2,
      prober: {
        async probeLiveness(endpoint) {
          peak = Math.max(peak, ++active);
          await new Promise((r) => setTimeout(r, 20));
          try {
            return await prober.probeLiveness(endpoint);
          } finally {
            active--;
          }
        },
        verifyEndpoint: (endpoint, modelNames) => prober.verifyEndpoint(endpoint, modelNames),
      },
    });
    now += 1;
    const result = await m.probeAll();
    expect(result.probed).toBeGreaterThanOrEqual(offers.length);
    expect(peak).toBe(2);
    for (const offerId of offers) {
      expect(await getEndpointHealth(db, offerId)).toMatchObject({ running: true, checkedAt: now });
    }
  });

  it("skips endpoints probed recently when asked to", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    now += 1;
    await m.probeAll();
    const calls = f.calls("/v1/models");
    now += 10;
    await m.probeAll({ minAgeSeconds: 30 });
    expect(f.calls("/v1/models")).toBe(calls);
    expect(await getEndpointHealth(db, offerId)).toMatchObject({ checkedAt: now - 10 });
  });

  it("probes on demand only when the last verdict is stale", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor({ staleMs: 30_000 });
    expect(await m.probeIfStale(offerId)).toMatchObject({ running: true, checkedAt: now });
    expect(f.calls("/v1/models")).toBe(1);

    now += 10;
    await f.stop();
    expect(await m.probeIfStale(offerId)).toMatchObject({ running: true, checkedAt: now - 10 });

    now += 30;
    expect(await m.probeIfStale(offerId)).toMatchObject({ running: false, checkedAt: now });
    expect(await m.probeIfStale(`0x${"ee".repeat(32)}`)).toBeUndefined();
  });

  it("shares one probe between concurrent on-demand requests", async () => {
    const f = await fake({ delayMs: 0 });
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    await Promise.all(Array.from({ length: 5 }, () => m.probeIfStale(offerId)));
    expect(f.calls("/v1/models")).toBe(1);
  });

  it("marks an endpoint whose seal cannot be opened as not running", async () => {
    const offerId = await registeredOffer({ url: "http://127.0.0.1:9/" });
    const m = monitor({
      open: () => {
        throw new Error("unsupported state or unable to authenticate data");
      },
    });
    expect(await m.probeIfStale(offerId)).toMatchObject({ running: false });
  });

  it("verifies a conforming provider and records it", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    expect(await m.verify(offerId, names, 3600)).toEqual({
      ok: true,
      outcome: "verified",
      ranAt: now,
      replayed: false,
      nextRunAt: now,
      verifiedAt: now,
      expiresAt: now + 3600,
    });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      running: true,
      verifiedAt: now,
      verificationExpiresAt: now + 3600,
      verificationError: undefined,
    });
  });

  it.each([
    ["does not list the model", { models: ["someone/else"] }, "model_not_listed"],
    ["omits usage", { omitUsage: true }, "usage_missing"],
  ] as const)(
    "fails verification against a provider that %s and clears verified_at",
    async (_name, opts, check) => {
      const f = await fake();
      const offerId = await registeredOffer({ url: f.url, token });
      const m = monitor();
      expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true });

      f.setOptions(opts);
      now += 100;
      const result = await m.verify(offerId, names, 3600);
      expect(result).toMatchObject({
        ok: false,
        outcome: "rejected",
        check,
        verifiedAt: undefined,
      });
      expect(await getEndpointHealth(db, offerId)).toMatchObject({
        running: true,
        verifiedAt: undefined,
        verificationExpiresAt: undefined,
        verificationError: check,
      });
      const { rows } = await db.query<{ verified_at: string | null }>(
        "SELECT verified_at FROM provider_endpoints WHERE offer_id = $1",
        [offerId],
      );
      expect(rows[0]?.verified_at).toBeNull();
    },
  );

  it("fails verification of a stopped provider as unreachable and not running", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    await f.stop();
    const result = await monitor().verify(offerId, names, 3600);
    expect(result).toMatchObject({
      ok: false,
      outcome: "unreachable",
      check: "endpoint_unreachable",
    });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      running: false,
      verifiedAt: undefined,
      verificationError: "endpoint_unreachable",
    });
  });

  // DESIGN.md section 8, "No one can knock an offer out".
  it.each([
    ["a 429", { failStatus: 429 }],
    ["a 503", { failStatus: 503 }],
    ["a timeout", { stallBeforeHeadersMs: 5_000 }],
    ["a stream cut mid-way", { failMidStream: true }],
  ] as const)("keeps a standing verification through %s", async (_name, opts) => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const prober = createEndpointProber(upstream, { verifyTimeoutMs: 300 });
    const m = monitor({ prober });
    const verifiedAt = now;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true });
    f.setOptions(opts);
    now += 100;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({
      ok: false,
      outcome: "unreachable",
      check: "endpoint_unreachable",
      ranAt: now,
      replayed: false,
      verifiedAt,
      expiresAt: verifiedAt + 3600,
    });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt,
      verificationExpiresAt: verifiedAt + 3600,
    });
    const { rows } = await db.query(
      `SELECT last_verification_at, last_verification_outcome, last_verification_check
       FROM provider_endpoints WHERE offer_id = $1`,
      [offerId],
    );
    expect(rows[0]).toEqual({
      last_verification_at: String(now),
      last_verification_outcome: "unreachable",
      last_verification_check: "endpoint_unreachable",
    });
    expect(logLines.some((l) => l.includes('"outcome":"unreachable"'))).toBe(true);
  });

  it("keeps a standing verification through a refused connection", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    const verifiedAt = now;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true });
    await f.stop();
    now += 10;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({
      outcome: "unreachable",
      check: "endpoint_unreachable",
      message: expect.stringContaining("GET /v1/models failed"),
    });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt,
      verificationExpiresAt: verifiedAt + 3600,
    });
  });

  // Issue 27, item 9: a usage claim above the gateway's count is a wrong answer.
  it("fails a provider whose usage claims diverge, clearing its standing verification", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true });
    f.setOptions({ inflateUsage: { outputLimit: true } });
    now += 100;
    const result = await m.verify(offerId, names, 3600, {
      model: { repository: "acme/llama", revision: "main" },
      reasoning: { hiddenReasoningRatio: 0n },
    });
    expect(result).toMatchObject({
      ok: false,
      outcome: "rejected",
      check: "usage_diverged",
      message: `a chat completion whose usage the gateway counts: usage claim ${countingMaxTokens} output tokens for an answer the gateway counts 17 with the byte bound (tolerance 0)`,
      verifiedAt: undefined,
      expiresAt: undefined,
    });
    expect(await getEndpointHealth(db, offerId)).toMatchObject({
      verifiedAt: undefined,
      verificationExpiresAt: undefined,
      verificationError: "usage_diverged",
    });
  });

  // Issue 27, item 5: "until its operator verifies again".
  it("clears a usage exclusion only by a verification that passes", async () => {
    const f = await fake({ inflateUsage: { outputLimit: true } });
    const offerId = await registeredOffer({ url: f.url, token });
    const excluded = await excludeOffer(
      db,
      { offerId, claimed: 20, diverged: 20, since: 0 },
      now - 50,
    );
    expect(excluded).toBe(true);
    const standing = async () => (await readUsageExclusions(db)).find((e) => e.offerId === offerId);
    expect(await standing()).toEqual({ offerId, excludedAt: now - 50, clearedAt: undefined });
    const m = monitor();
    // Still lying: rejected, and the exclusion stands.
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ check: "usage_diverged" });
    // No answer at all: nothing said about the endpoint, the exclusion stands.
    f.setOptions({ inflateUsage: undefined, failStatus: 503 });
    now += 10;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ outcome: "unreachable" });
    expect(await standing()).toEqual({ offerId, excludedAt: now - 60, clearedAt: undefined });
    // Honest again: verified, and the exclusion cleared then.
    f.setOptions({ failStatus: undefined });
    now += 10;
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true });
    expect(await standing()).toEqual({ offerId, excludedAt: now - 70, clearedAt: now });
    // A process that saw the clearing cannot exclude it again with its counts from before.
    expect(
      await excludeOffer(db, { offerId, claimed: 20, diverged: 20, since: now - 1 }, now),
    ).toBe(false);
    // With counts that follow the clearing it can.
    now += 10;
    expect(
      await excludeOffer(db, { offerId, claimed: 20, diverged: 20, since: now - 10 }, now),
    ).toBe(true);
    expect(await standing()).toEqual({ offerId, excludedAt: now, clearedAt: undefined });
    // Standing: a second exclusion writes nothing.
    expect(await excludeOffer(db, { offerId, claimed: 30, diverged: 30, since: 0 }, now)).toBe(
      false,
    );
  });

  it("shares one run among concurrent callers", async () => {
    const f = await fake({ delayMs: 50 });
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    const results = await Promise.all(
      Array.from({ length: 20 }, () => m.verify(offerId, names, 60)),
    );
    expect(f.calls("/v1/models")).toBe(1);
    // One-token completion, stream, the counting completion (JSON and streamed), then the
    // tools, JSON-schema and logprobs feature checks.
    expect(f.calls("/v1/chat/completions")).toBe(7);
    expect(new Set(results).size).toBe(1);
    expect(results[0]).toMatchObject({ ok: true, replayed: false });
  });

  it("answers the last run inside the bound, fleet-wide, and runs again after it", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    // Two monitors on one database: two gateway processes.
    const [a, b] = [
      monitor({ verifyMinIntervalSeconds: 60 }),
      monitor({ verifyMinIntervalSeconds: 60 }),
    ];
    const first = now;
    expect(await a.verify(offerId, names, 3600)).toMatchObject({
      ok: true,
      replayed: false,
      ranAt: first,
      nextRunAt: first + 60,
    });
    expect(f.calls("/v1/models")).toBe(1);
    f.setOptions({ models: ["someone/else"] });
    now += 59;
    for (const m of [a, b]) {
      expect(await m.verify(offerId, names, 3600)).toEqual({
        ok: true,
        outcome: "verified",
        ranAt: first,
        replayed: true,
        nextRunAt: first + 60,
        verifiedAt: first,
        expiresAt: first + 3600,
      });
    }
    // No upstream call inside the bound, so the wrong answer is not seen yet.
    expect(f.calls("/v1/models")).toBe(1);
    now += 1;
    expect(await b.verify(offerId, names, 3600)).toMatchObject({
      ok: false,
      outcome: "rejected",
      check: "model_not_listed",
      replayed: false,
      ranAt: now,
      nextRunAt: now + 60,
    });
    expect(f.calls("/v1/models")).toBe(2);
    // The failure is what the next callers inside the bound are answered.
    expect(await a.verify(offerId, names, 3600)).toMatchObject({
      ok: false,
      outcome: "rejected",
      check: "model_not_listed",
      replayed: true,
      ranAt: now,
      message: expect.stringContaining("does not list the offer's model"),
    });
    expect(f.calls("/v1/models")).toBe(2);
  });

  it("answers rate_limited while another process's first run is under way", async () => {
    const f = await fake({ delayMs: 300 });
    const offerId = await registeredOffer({ url: f.url, token });
    const [a, b] = [
      monitor({ verifyMinIntervalSeconds: 60 }),
      monitor({ verifyMinIntervalSeconds: 60 }),
    ];
    const running = a.verify(offerId, names, 3600);
    await vi.waitFor(() => expect(f.calls("/v1/models")).toBe(1));
    const err: unknown = await b.verify(offerId, names, 3600).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe("rate_limited");
    expect((err as GatewayError).retryAfterSeconds).toBe(60);
    expect(await running).toMatchObject({ ok: true });
    expect(await b.verify(offerId, names, 3600)).toMatchObject({ ok: true, replayed: true });
    expect(f.calls("/v1/models")).toBe(1);
  });

  it("lets a re-registered endpoint be verified at once", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor({ verifyMinIntervalSeconds: 60 });
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true, replayed: false });
    await upsertProviderEndpoint(db, {
      offerId,
      operator: `0x${"33".repeat(20)}`,
      endpointSealed: seal({ url: f.url, token }),
      registeredAt: now,
    });
    expect(await m.verify(offerId, names, 3600)).toMatchObject({ ok: true, replayed: false });
    expect(f.calls("/v1/models")).toBe(2);
  });

  it("refuses to verify an offer without an endpoint", async () => {
    const err: unknown = await monitor()
      .verify(`0x${"dd".repeat(32)}`, names, 60)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe("offer_not_found");
  });

  it("never logs an endpoint URL or token", async () => {
    const f = await fake();
    const offerId = await registeredOffer({ url: f.url, token });
    const m = monitor();
    await m.verify(offerId, names, 60);
    await f.stop();
    now += 100;
    await m.probeAll();
    await m.verify(offerId, names, 60);
    expect(logLines.length).toBeGreaterThan(0);
    for (const line of logLines) {
      expect(line).not.toContain(String(f.port));
      expect(line).not.toContain(token);
    }
  });
});
