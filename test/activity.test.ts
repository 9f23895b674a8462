import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import * as grpc from "@grpc/grpc-js";
import { InferenceService, UsageBucket } from "../gen/gateway/v1/inference_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  listRequestsQuery,
  pageSettings,
  usageQuery,
  type SqlQuery,
} from "../src/adapters/pg/activity.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { seededRecord, seedRequests, type SeedSpec } from "./helpers/activity-seed.js";
import { authorizeKey } from "./helpers/authorize.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { testDatabaseUrl } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { json, startChatStack, type TestStack } from "./helpers/stack.js";
import { payerCredential } from "./helpers/x402.js";

/**
 * Issue 38, item 1: a key's requests (GET /v1/requests), the usage of a key or a permit
 * (GET /v1/usage) and the permits a key may spend (GET /v1/permits), through the real HTTP stack:
 * what one key (or payer) can see of another's, and, on PostgreSQL, 10,000 records paged in
 * order with every filter, usage equal to the records' sums, and the plans reading by index.
 */

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

describe("activity: GET /v1/requests, GET /v1/usage, GET /v1/permits", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  /** A second key the demo payer authorized too. */
  let other: { id: string; key: string };
  /** Its authorization (every permit of the demo payer). */
  let otherAuthorization: string;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    other = await createApiKey(stack.database.db.pool, "other");
    otherAuthorization = (
      await authorizeKey(stack.gateway.url, other.key, stack.roles.payer.privateKey)
    ).id;
  }, 120_000);

  /** A payer's ReadPayerRequests credential (`Authorization: Payer ...`), signed by `privateKey`. */
  const payerToken = (privateKey: Hex) => payerCredential(stack, privateKeyToAccount(privateKey));
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const get = async (path: string, key: string = stack.apiKey) => {
    const res = await fetch(`${stack.gateway.url}${path}`, {
      headers: { authorization: key.startsWith("Payer ") ? key : `Bearer ${key}` },
    });
    return { status: res.status, body: (await json(res)) as Json };
  };

  async function chat(key: string): Promise<string> {
    const res = await fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
      },
      body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    return res.headers.get("x-gateway-request-id")!;
  }

  it("a key lists its own requests, each as GET /v1/requests/{id} shows it; another key's never appear", async () => {
    const mine = [await chat(stack.apiKey), await chat(stack.apiKey)];
    const theirs = await chat(other.key);
    const listed = await get("/v1/requests");
    expect(listed.status).toBe(200);
    const records = listed.body.data as Json[];
    const ids = records.map((r) => r.id);
    // Newest first; two made in the same second are ordered by id.
    expect(ids.toSorted()).toEqual(mine.toSorted());
    const [a, b] = records as [Json, Json];
    expect(a.created_at > b.created_at || (a.created_at === b.created_at && a.id > b.id)).toBe(
      true,
    );
    expect(ids).not.toContain(theirs);
    for (const record of listed.body.data as Json[])
      expect(record).toEqual((await get(`/v1/requests/${record.id}`)).body);
    const otherList = await get("/v1/requests", other.key);
    expect((otherList.body.data as Json[]).map((r) => r.id)).toEqual([theirs]);
    // A cursor from another key's request is no page of this key's.
    const probe = await get(`/v1/requests?starting_after=${theirs}`);
    expect(probe.body).toEqual({ object: "list", data: [], has_more: false });
    // Usage: the key's own requests only.
    const usage = await get("/v1/usage?bucket=hour");
    expect(usage.status).toBe(200);
    const groups = usage.body.groups as Json[];
    expect(groups.reduce((n, g) => n + (g.requests as number), 0)).toBe(2);
    const credits = (listed.body.data as Json[]).reduce(
      (n, r) => n + BigInt(r.credits_charged as string),
      0n,
    );
    expect(groups.reduce((n, g) => n + BigInt(g.credits as string), 0n)).toBe(credits);
    // A permit's usage counts every key's requests on it.
    const permitUsage = await get(`/v1/usage?bucket=hour&permit=${stack.demo.permitId}`);
    expect((permitUsage.body.groups as Json[]).reduce((n, g) => n + g.requests, 0)).toBe(3);
  });

  it("answers the same over gRPC (@grpc/grpc-js): ListRequests, GetUsage, ListPermits", async () => {
    const client = grpcClient(stack.gateway.url);
    const auth = { authorization: `Bearer ${stack.apiKey}` };
    try {
      const rest = await get("/v1/requests?limit=1");
      const listed = await grpcUnary(
        client,
        InferenceService.method.listRequests,
        { limit: 1 },
        auth,
      );
      expect(listed.requests.map((r) => r.id)).toEqual([rest.body.data[0].id]);
      expect(listed.hasMore).toBe(rest.body.has_more);
      const usage = await grpcUnary(
        client,
        InferenceService.method.getUsage,
        { bucket: UsageBucket.HOUR, permitId: stack.demo.permitId },
        auth,
      );
      const restUsage = await get(
        `/v1/usage?bucket=hour&permit=${stack.demo.permitId}&from=${usage.from}&to=${usage.to}`,
      );
      expect(usage.groups.map((g) => g.credits)).toEqual(
        (restUsage.body.groups as Json[]).map((g) => g.credits),
      );
      const permits = await grpcUnary(client, InferenceService.method.listPermits, {}, auth);
      expect(permits.everyPermitPayers).toEqual([stack.roles.payer.address.toLowerCase()]);
      // Without a key: UNAUTHENTICATED, as every keyed RPC.
      const refused = await grpcUnary(client, InferenceService.method.listRequests, {}).catch(
        (e: grpc.ServiceError) => e,
      );
      expect((refused as grpc.ServiceError).code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      client.close();
    }
  });

  it("a key the payer did not authorize for a permit is refused its usage exactly as GET /v1/permits/{id}", async () => {
    const stranger = await createApiKey(stack.database.db.pool, "stranger");
    const balance = await get(`/v1/permits/${stack.demo.permitId}`, stranger.key);
    const usage = await get(`/v1/usage?permit=${stack.demo.permitId}`, stranger.key);
    expect(balance.status).toBe(403);
    expect(balance.body.error.code).toBe("permit_not_authorized");
    expect(usage).toEqual(balance);
    // It lists no permit, and none of the requests on the permit.
    expect((await get("/v1/permits", stranger.key)).body).toEqual({
      object: "list",
      data: [],
      every_permit_payers: [],
    });
    expect((await get("/v1/requests", stranger.key)).body.data).toEqual([]);
  });

  it("GET /v1/permits: each permit an authorization names with its balance as GET /v1/permits/{id}, and every permit the payer of an every-permit authorization opened", async () => {
    const payer = stack.roles.payer.address.toLowerCase();
    // The list, and each permit's own answer read just after it: settlement moves a permit's
    // `settled` at any time, so they are compared once a list and its permits' reads agree.
    const listed = async (permits: Hex[], key?: string) => {
      const list = await get("/v1/permits", key);
      const data = await Promise.all(
        permits
          .map((p) => p.toLowerCase())
          .sort()
          .map(async (p) => (await get(`/v1/permits/${p}`, key)).body),
      );
      return { status: list.status, body: list.body, data };
    };
    const agree = async (permits: Hex[], everyPermitPayers: string[], key?: string) =>
      expect
        .poll(
          async () => {
            const read = await listed(permits, key);
            return read.status === 200 &&
              JSON.stringify(read.body) ===
                JSON.stringify({
                  object: "list",
                  data: read.data,
                  every_permit_payers: everyPermitPayers,
                })
              ? "agree"
              : JSON.stringify(read);
          },
          { timeout: 5000 },
        )
        .toBe("agree");
    // The demo key may spend every permit of the demo payer: the demo permit is listed, with
    // no permit id pasted anywhere.
    await agree([stack.demo.permitId], [payer]);
    const named = await createApiKey(stack.database.db.pool, "named");
    const second = await openPermit(stack, { deposit: 10n ** 21n });
    // A permit the payer opens later is covered by the same authorization: listed once the
    // indexer has seen it open, with nothing signed again.
    await agree([stack.demo.permitId, second], [payer]);
    for (const permitId of [stack.demo.permitId, second])
      await authorizeKey(stack.gateway.url, named.key, stack.roles.payer.privateKey, { permitId });
    // A key the payer named the permits for: both listed, and no every-permit payer.
    await agree([stack.demo.permitId, second], [], named.key);
  });

  it("a payer lists the requests it paid with x402 on its signature, and no key's", async () => {
    const payer = privateKeyToAccount(stack.anvil.accounts[8]!.privateKey);
    const spec = bulkSpec(`x402:${payer.address.toLowerCase()}`, 7, "x402", [
      stack.demo.permitId,
      stack.demo.permitId,
    ]);
    await seedRequests(stack.database.db.pool, spec);
    const token = await payerCredential(stack, payer);
    const listed = await get("/v1/requests", token);
    expect(listed.status).toBe(200);
    expect((listed.body.data as Json[]).length).toBe(7);
    const from = spec.start;
    const usage = await get(`/v1/usage?from=${from}&to=${from + 86_400}`, token);
    expect((usage.body.groups as Json[]).reduce((n, g) => n + g.requests, 0)).toBe(7);
  });

  it("a payer reads its own usage on its signature (its permits' requests, every key's, and its x402 payments); another payer and any key are refused 403 not_payer", async () => {
    const demoPayer = privateKeyToAccount(stack.roles.payer.privateKey).address;
    const requestIds = [await chat(stack.apiKey), await chat(other.key), await chat(other.key)];
    const now = Math.floor(Date.now() / 1000);
    const range = `from=${now - 3600}&to=${now + 60}`;
    const own = await get(
      `/v1/usage?payer=${demoPayer}&${range}`,
      await payerToken(stack.roles.payer.privateKey),
    );
    expect(own.status).toBe(200);
    expect(own.body.payer).toBe(demoPayer.toLowerCase());
    expect(own.body.permit_id).toBeNull();
    // The same requests the permit's usage has: every request on the demo payer's permit, by
    // either key (each admitted through an authorization the payer signed).
    const permitUsage = await get(`/v1/usage?permit=${stack.demo.permitId}&${range}`);
    expect(own.body.groups).toEqual(permitUsage.body.groups);
    // Every record of the range the payer's authorizations admitted, the three just made among
    // them: what the database holds, counted apart.
    const { rows } = await stack.database.db.pool.query<{ id: string }>(
      `SELECT ir.id FROM inference_requests ir JOIN permit_authorizations a
         ON a.id = ir.authorization_id
       WHERE a.payer = $1 AND ir.created_at >= $2 AND ir.created_at < $3`,
      [demoPayer.toLowerCase(), now - 3600, now + 60],
    );
    expect(rows.map((r) => r.id)).toEqual(expect.arrayContaining(requestIds));
    expect((own.body.groups as Json[]).reduce((n, g) => n + g.requests, 0)).toBe(rows.length);

    // Another payer (its own x402 requests only, on its own signature) cannot read this one's.
    const stranger = stack.anvil.accounts[8]!.privateKey;
    const strangerToken = await payerToken(stranger);
    const refused = await get(`/v1/usage?payer=${demoPayer}&${range}`, strangerToken);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("not_payer");
    const strangerOwn = await get(
      `/v1/usage?payer=${privateKeyToAccount(stranger).address}&${range}`,
      strangerToken,
    );
    expect(strangerOwn.status).toBe(200);
    expect(strangerOwn.body.groups).toEqual([]);
    // Nor can any key, even one the payer authorized.
    for (const key of [stack.apiKey, other.key]) {
      const byKey = await get(`/v1/usage?payer=${demoPayer}&${range}`, key);
      expect(byKey.status).toBe(403);
      expect(byKey.body.error.code).toBe("not_payer");
    }
    const both = await get(
      `/v1/usage?payer=${demoPayer}&permit=${stack.demo.permitId}`,
      await payerToken(stack.roles.payer.privateKey),
    );
    expect(both.status).toBe(400);
    expect(both.body.error.code).toBe("invalid_request");
  });

  /** A seed of `count` records from 2024-01-10 05:00 UTC, 173 s between pairs (about 10 days). */
  function bulkSpec(apiKeyId: string, count: number, tag: string, permits: [Hex, Hex]): SeedSpec {
    const offer = (n: number) => `0x${n.toString(16).padStart(64, "0")}`;
    return {
      apiKeyId,
      count,
      start: 1_704_862_800,
      step: 173,
      models: ["demo-chat", "model-b", "model-c"],
      offers: [
        [offer(1), offer(2)],
        [offer(3), offer(4)],
        [offer(5), offer(6)],
      ],
      permits: [permits[0].toLowerCase(), permits[1].toLowerCase()],
      tag,
    };
  }

  describe.skipIf(testDatabaseUrl() === undefined)(
    "10,000 records across three models and two permits (PostgreSQL only: set TEST_DATABASE_URL)",
    () => {
      let bulk: { id: string; key: string };
      let spec: SeedSpec;
      let noise: SeedSpec;
      const count = 10_000;
      /** The other key's records: the bulk key's are a quarter of the table. */
      const noiseCount = 30_000;

      beforeAll(async () => {
        bulk = await createApiKey(stack.database.db.pool, "bulk");
        const bulkAuthorization = await authorizeKey(
          stack.gateway.url,
          bulk.key,
          stack.roles.payer.privateKey,
        );
        const second = await openPermit(stack, { deposit: 10n ** 21n });
        spec = {
          ...bulkSpec(bulk.id, count, "bulk", [stack.demo.permitId, second]),
          authorizationId: bulkAuthorization.id,
        };
        // Another key's records on the same permits, models and times: never in the bulk key's
        // list or usage, always in its permits' usage and its payer's.
        noise = {
          ...bulkSpec(other.id, noiseCount, "noise", [stack.demo.permitId, second]),
          authorizationId: otherAuthorization,
        };
        await seedRequests(stack.database.db.pool, spec);
        await seedRequests(stack.database.db.pool, noise);
      }, 120_000);

      const expected = () => Array.from({ length: count }, (_, i) => seededRecord(spec, i));

      /** Every page of `query` (limit 100), checked newest first, with its records. */
      async function pageAll(query: string): Promise<Json[]> {
        const out: Json[] = [];
        let after = "";
        for (;;) {
          const page = await get(`/v1/requests?limit=100${query}${after}`, bulk.key);
          expect(page.status).toBe(200);
          out.push(...(page.body.data as Json[]));
          if (!page.body.has_more) break;
          expect(page.body.data).toHaveLength(100);
          after = `&starting_after=${out.at(-1)!.id}`;
        }
        for (let k = 1; k < out.length; k++) {
          const [a, b] = [out[k - 1]!, out[k]!];
          expect(
            a.created_at > b.created_at || (a.created_at === b.created_at && a.id > b.id),
          ).toBe(true);
        }
        return out;
      }

      it("GET /v1/requests pages through all of them, newest first, with every filter", async () => {
        const all = expected();
        const everything = await pageAll("");
        expect(everything).toHaveLength(count);
        expect(new Set(everything.map((r) => r.id)).size).toBe(count);
        expect(everything.every((r) => r.created_at >= spec.start)).toBe(true);
        const [from, to] = [spec.start + 200_000, spec.start + 500_000];
        const cases: [string, (r: ReturnType<typeof seededRecord>) => boolean][] = [
          ["&model=model-b", (r) => r.model === "model-b"],
          [`&permit=${spec.permits[1]}`, (r) => r.permitId === spec.permits[1]],
          ["&status=failed", (r) => r.status === "failed"],
          ["&status=pending", (r) => r.status === "pending"],
          [`&created_after=${from}`, (r) => r.createdAt >= from],
          [`&created_before=${to}`, (r) => r.createdAt < to],
          [
            `&model=model-c&permit=${spec.permits[0]}&status=completed&created_after=${from}&created_before=${to}`,
            (r) =>
              r.model === "model-c" &&
              r.permitId === spec.permits[0] &&
              r.status === "completed" &&
              r.createdAt >= from &&
              r.createdAt < to,
          ],
        ];
        for (const [query, keep] of cases) {
          const want = all.filter(keep);
          const got = await pageAll(query);
          expect({ query, n: got.length }).toEqual({ query, n: want.length });
          // The same records, in the same order as the unfiltered list's.
          const ids = new Set(got.map((r) => r.id));
          expect(got.map((r) => r.id)).toEqual(
            everything.filter((r) => ids.has(r.id)).map((r) => r.id),
          );
          for (const r of got) {
            expect(keep(toSeeded(r))).toBe(true);
          }
        }
      }, 120_000);

      function toSeeded(r: Json): ReturnType<typeof seededRecord> {
        return {
          model: r.model,
          offerId: r.offer_id,
          permitId: r.permit_id,
          status: r.status,
          createdAt: r.created_at,
        } as ReturnType<typeof seededRecord>;
      }

      /** The seed's sums by (bucket start, model), and by every member, computed in TS. */
      function sums(records: ReturnType<typeof seededRecord>[], bucket: number) {
        const out = new Map<string, Record<string, bigint>>();
        for (const r of records) {
          const key = `${Math.floor(r.createdAt / bucket) * bucket}/${r.model}`;
          const s = out.get(key) ?? {
            requests: 0n,
            input_tokens: 0n,
            output_tokens: 0n,
            claimed_input_tokens: 0n,
            claimed_output_tokens: 0n,
            counted_input_tokens: 0n,
            counted_output_tokens: 0n,
            credits: 0n,
          };
          s.requests! += 1n;
          s.input_tokens! += r.inputTokens;
          s.output_tokens! += r.outputTokens;
          s.claimed_input_tokens! += r.claimedInput;
          s.claimed_output_tokens! += r.claimedOutput;
          s.counted_input_tokens! += r.countedInput;
          s.counted_output_tokens! += r.countedOutput;
          s.credits! += r.credits;
          out.set(key, s);
        }
        return out;
      }

      /** An answer's groups summed over offers, by (bucket start, model). */
      function byModel(groups: Json[]) {
        const out = new Map<string, Record<string, bigint>>();
        for (const g of groups) {
          const key = `${g.starts_at}/${g.model}`;
          const s = out.get(key) ?? {};
          for (const [name, value] of Object.entries(g)) {
            if (name === "starts_at" || name === "model" || name === "offer_id") continue;
            s[name] = (s[name] ?? 0n) + BigInt(value as string | number);
          }
          out.set(key, s);
        }
        return out;
      }

      it("GET /v1/usage by day and model equals the sums of the records (a key's, a permit's; by hour too)", async () => {
        const all = expected();
        const end = spec.start + (count / 2) * spec.step;
        const usage = await get(`/v1/usage?bucket=day&from=${spec.start}&to=${end}`, bulk.key);
        expect(usage.status).toBe(200);
        expect(usage.body).toMatchObject({
          object: "usage",
          bucket: "day",
          permit_id: null,
          from: spec.start,
          to: end,
        });
        const groups = usage.body.groups as Json[];
        expect(new Set(groups.map((g) => g.model))).toEqual(
          new Set(["demo-chat", "model-b", "model-c"]),
        );
        expect(byModel(groups)).toEqual(sums(all, 86_400));
        // Each offer's group is its records' too.
        const offerGroup = groups.find((g) => g.offer_id === spec.offers[1][1])!;
        const ofOffer = all.filter(
          (r) =>
            r.offerId === spec.offers[1][1] &&
            Math.floor(r.createdAt / 86_400) * 86_400 === offerGroup.starts_at,
        );
        expect(offerGroup.requests).toBe(ofOffer.length);

        // A permit's usage: every key's records on it (the noise key's included).
        const permit = spec.permits[1];
        const permitUsage = await get(
          `/v1/usage?permit=${permit}&from=${spec.start}&to=${end}`,
          bulk.key,
        );
        expect(permitUsage.status).toBe(200);
        const ofPermit = [
          ...all,
          ...Array.from({ length: noiseCount }, (_, i) => seededRecord(noise, i)),
        ].filter((r) => r.permitId === permit && r.createdAt < end);
        expect(byModel(permitUsage.body.groups as Json[])).toEqual(sums(ofPermit, 86_400));

        // The payer's usage, on its signature: both keys' records on both its permits.
        const payer = privateKeyToAccount(stack.roles.payer.privateKey).address;
        const payerToken_ = await payerToken(stack.roles.payer.privateKey);
        const payerPath = `/v1/usage?payer=${payer}&from=${spec.start}&to=${end}`;
        const payerUsage = await get(payerPath, payerToken_);
        expect(payerUsage.status).toBe(200);
        const ofPayer = [
          ...all,
          ...Array.from({ length: noiseCount }, (_, i) => seededRecord(noise, i)),
        ].filter((r) => r.createdAt < end);
        expect(byModel(payerUsage.body.groups as Json[])).toEqual(sums(ofPayer, 86_400));
        // Over 10,000 of the payer's requests (both keys' records of the range's first 2,500
        // seconds-pairs: 5,000 each). How fast is the bench's to say, never a timed test; that
        // it is read by index is checked with EXPLAIN below.
        const tenThousand = `/v1/usage?payer=${payer}&from=${spec.start}&to=${spec.start + 2_500 * spec.step}`;
        const counted = await get(tenThousand, payerToken_);
        expect((counted.body.groups as Json[]).reduce((n, g) => n + g.requests, 0)).toBe(10_000);

        // By hour over two days.
        const [from, to] = [spec.start + 86_400, spec.start + 3 * 86_400];
        const hourly = await get(`/v1/usage?bucket=hour&from=${from}&to=${to}`, bulk.key);
        expect(hourly.body.bucket).toBe("hour");
        expect(byModel(hourly.body.groups as Json[])).toEqual(
          sums(
            all.filter((r) => r.createdAt >= from && r.createdAt < to),
            3600,
          ),
        );
        // Ranges are bounded.
        const tooLong = await get(`/v1/usage?bucket=hour&from=${from}&to=${from + 8 * 86_400}`);
        expect(tooLong.status).toBe(400);
        expect(tooLong.body.error.code).toBe("invalid_request");
      }, 60_000);

      /** The plan of `query`, under `settings` as the adapter reads it. */
      async function plan(query: SqlQuery, settings?: string): Promise<string> {
        const client = await stack.database.db.pool.connect();
        try {
          await client.query("BEGIN");
          if (settings !== undefined) await client.query(settings);
          const { rows } = await client.query<{ "QUERY PLAN": string }>(
            `EXPLAIN ${query.text}`,
            query.values,
          );
          return rows.map((r) => r["QUERY PLAN"]).join("\n");
        } finally {
          await client.query("ROLLBACK");
          client.release();
        }
      }

      it("EXPLAIN: the list and the usage read inference_requests by index, never by a sequential scan", async () => {
        // The database as the gateway runs it: autovacuum is off, so no statistics are taken
        // behind its back. (With ANALYZE on a table this small, a quarter of it is cheaper read
        // whole, and the planner rightly says so; at a fleet's size a key's range is not.)
        const all = expected();
        const cursor = (await get("/v1/requests?limit=1", bulk.key)).body.data[0].id as string;
        const lists = [
          listRequestsQuery(bulk.id, {}, 101, undefined),
          listRequestsQuery(bulk.id, {}, 101, cursor),
          listRequestsQuery(
            bulk.id,
            {
              model: "model-b",
              permitId: spec.permits[0] as Hex,
              status: "failed",
              createdAfter: all[100]!.createdAt,
              createdBefore: all[9000]!.createdAt,
            },
            101,
            cursor,
          ),
        ];
        for (const query of lists) {
          // A page is the key's index walked backwards from the cursor: nothing read to be sorted.
          const text = await plan(query, pageSettings);
          expect(text).not.toMatch(/Seq Scan on inference_requests/);
          expect(text).not.toMatch(/Sort/);
          expect(text).toMatch(/Index Scan Backward using inference_requests_key_created/);
        }
        const end = spec.start + (count / 2) * spec.step;
        const keyUsage = await plan(usageQuery({ apiKeyId: bulk.id }, "day", spec.start, end));
        expect(keyUsage).not.toMatch(/Seq Scan on inference_requests/);
        expect(keyUsage).toMatch(/inference_requests_key_created/);
        const permitUsage = await plan(
          usageQuery({ permitId: spec.permits[1] as Hex }, "day", spec.start, end),
        );
        expect(permitUsage).not.toMatch(/Seq Scan on inference_requests/);
        expect(permitUsage).toMatch(/inference_requests_permit_created/);
        // A payer's: its authorizations by payer, each one's requests by its index, and its
        // x402 payments' by their caller id's.
        const payer = privateKeyToAccount(stack.roles.payer.privateKey).address.toLowerCase();
        const payerUsage = await plan(
          usageQuery({ payer: payer as Hex, x402Caller: `x402:${payer}` }, "day", spec.start, end),
        );
        expect(payerUsage).not.toMatch(/Seq Scan on inference_requests/);
        expect(payerUsage).toMatch(/inference_requests_authorization/);
        expect(payerUsage).toMatch(/inference_requests_key_created/);
      });
    },
  );
});
