import { randomBytes } from "node:crypto";
import pg from "pg";
import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { createAuthorizationThresholds } from "../src/adapters/pg/authorization-warnings.js";
import { insertPermitAuthorization } from "../src/adapters/pg/permit-authorizations.js";
import { authorizeKey, signable, type AuthorizationView } from "./helpers/authorize.js";
import { describeIfPostgres, useTestDatabase } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { hex32, NOW } from "./helpers/ledger.js";
import { openPermit } from "./helpers/market.js";
import { sseData } from "./helpers/sse.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

interface Warning {
  code: string;
  message: string;
  authorization_id: string;
  warn_at: string;
  used: string;
  cap: string;
  period: string;
  period_renews_at: number | null;
}

/**
 * A payer's soft threshold (issue 38, item 2): `warnAt`, signed in AuthorizeKey beside a daily
 * cap, puts `x_gateway.budget_warning` on every answer admitted at or over it (JSON and the last
 * SSE event of the three dialects), shows in the listing, and counts in the metrics, the
 * crossing once.
 */
describe("a payer's soft threshold on an authorization", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let agent: string;
  let maximum: bigint;
  let warned: AuthorizationView;
  let quiet: AuthorizationView;
  const chatBody = {
    model: "demo-chat",
    messages: [{ role: "user", content: "an agent's call" }],
    max_tokens: 16,
  };
  const call = (path: string, permitId: Hex, body: object) =>
    fetch(`${stack.gateway.url}${path}`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${agent}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify(body),
    });
  const ledgerSettled = (authorizationId: string) =>
    eventually(async () => {
      const { rows } = await stack.database.db.pool.query<{ reserved: string }>(
        "SELECT reserved::text FROM authorization_ledgers WHERE authorization_id = $1",
        [authorizationId],
      );
      return rows[0]?.reserved === "0";
    });
  const listing = async (): Promise<AuthorizationView[]> => {
    const res = await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
      headers: { authorization: `Bearer ${agent}` },
    });
    expect(res.status).toBe(200);
    return (await json(res)).data as AuthorizationView[];
  };
  const metric = async (name: string, period: string): Promise<number> => {
    const text = await (await fetch(`${stack.gateway.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith(`${name}{period="${period}"}`));
    return line === undefined ? 0 : Number(line.split(" ").at(-1));
  };

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    const quote = await json(
      await authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(chatBody),
      }),
    );
    maximum = BigInt(quote.maximum_credits);
    agent = (await createApiKey(stack.database.db.pool, "agent")).key;
    const payer = stack.roles.payer.privateKey;
    // The first request's maximum alone stays below the threshold; with anything it was charged,
    // the second's reaches it.
    warned = await authorizeKey(stack.gateway.url, agent, payer, {
      permitId: await openPermit(stack, { deposit: 1000n * maximum }),
      period: "day",
      periodCap: (100n * maximum).toString(),
      warnAt: (maximum + 1n).toString(),
    });
    quiet = await authorizeKey(stack.gateway.url, agent, payer, {
      permitId: await openPermit(stack, { deposit: 1000n * maximum }),
      totalCap: (100n * maximum).toString(),
    });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  it("is signed by the payer: the key holder cannot drop or lower it", async () => {
    const payer = privateKeyToAccount(stack.roles.payer.privateKey);
    const headers = { authorization: `Bearer ${agent}`, "content-type": "application/json" };
    const challenge = await fetch(`${stack.gateway.url}/v1/permit-authorizations/challenge`, {
      method: "POST",
      headers,
      body: JSON.stringify({
        payer: payer.address,
        permitId: warned.permit_id,
        totalCap: "1000",
        warnAt: "900",
      }),
    });
    expect(challenge.status).toBe(200);
    const typed = await json(challenge);
    expect(typed.message.warnAt).toBe("900");
    expect(typed.types.AuthorizeKey).toContainEqual({ name: "warnAt", type: "uint256" });
    const signature = await payer.signTypedData(signable(typed));
    const { message } = typed;
    for (const warnAt of ["0", "901", undefined]) {
      const res = await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
        method: "POST",
        headers,
        body: JSON.stringify({ ...message, signature, warnAt }),
      });
      expect(res.status).toBe(401);
      expect((await json(res)).error.code).toBe("invalid_signature");
    }
    // Above the cap it is measured against, or without a cap: refused before any signature.
    for (const [caps, text] of [
      [{ totalCap: "1000", warnAt: "1001" }, /warnAt is above totalCap/],
      [{ totalCap: "1000", period: "day", periodCap: "10", warnAt: "11" }, /above periodCap/],
      [{ perRequestCap: "10", warnAt: "5" }, /measured against a total or periodic cap/],
    ] as const) {
      const res = await fetch(`${stack.gateway.url}/v1/permit-authorizations/challenge`, {
        method: "POST",
        headers,
        body: JSON.stringify({ payer: payer.address, permitId: warned.permit_id, ...caps }),
      });
      expect(res.status).toBe(400);
      const error = (await json(res)).error;
      expect(error.code).toBe("authorization_cap_invalid");
      expect(error.message).toMatch(text);
    }
    // The valid one stores it as signed.
    const posted = await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
      method: "POST",
      headers,
      body: JSON.stringify({ ...message, signature }),
    });
    expect(posted.status).toBe(200);
    const stored = (await json(posted)).authorization as AuthorizationView;
    expect(stored.warn_at).toBe("900");
    const revoked = await fetch(`${stack.gateway.url}/v1/permit-authorizations/${stored.id}`, {
      method: "DELETE",
      headers: { authorization: `Bearer ${agent}` },
    });
    expect(revoked.status).toBe(200);
  });

  it("warns every answer admitted at or over it, in JSON and the last SSE event of each dialect; the listing and the metrics show it, the crossing once", async () => {
    const permitId = warned.permit_id;
    expect(warned.warn_at).toBe((maximum + 1n).toString());
    expect(warned.warn_reached).toBe(false);
    const first = await call("/v1/chat/completions", permitId, chatBody);
    expect(first.status).toBe(200);
    expect(first.headers.get("x-gateway-budget-warning")).toBeNull();
    await first.arrayBuffer();
    await ledgerSettled(warned.id);
    const charged = BigInt(first.headers.get("x-gateway-credits-charged")!);
    expect(charged).toBeGreaterThan(0n);

    // A chat completion's JSON answer is the provider's object: the warning is a header.
    const second = await call("/v1/chat/completions", permitId, chatBody);
    expect(second.status).toBe(200);
    const renews = (Math.floor(Date.now() / 1000 / 86_400) + 1) * 86_400;
    expect(JSON.parse(second.headers.get("x-gateway-budget-warning")!)).toEqual({
      code: "authorization_warn_threshold_reached",
      message: expect.stringContaining(`authorization ${warned.id} has used ${charged + maximum}`),
      authorization_id: warned.id,
      warn_at: (maximum + 1n).toString(),
      used: (charged + maximum).toString(),
      cap: (100n * maximum).toString(),
      period: "day",
      period_renews_at: renews,
    } satisfies Warning);

    const warningsOf = async (res: Response, last: (events: string[]) => unknown) => {
      expect(res.status).toBe(200);
      const isStream = res.headers.get("content-type")?.startsWith("text/event-stream");
      const body = isStream ? last(sseData(await res.text())) : await json(res);
      return (body as { x_gateway?: { budget_warning?: Warning } }).x_gateway?.budget_warning;
    };
    const chatSse = (events: string[]) => JSON.parse(events.at(-2)!);
    const lastEvent = (events: string[]) => JSON.parse(events.at(-1)!);
    const answers = [
      await warningsOf(
        await call("/v1/chat/completions", permitId, { ...chatBody, stream: true }),
        chatSse,
      ),
      await warningsOf(
        await call("/v1/responses", permitId, {
          model: "demo-chat",
          input: "an agent's call",
          max_output_tokens: 16,
        }),
        lastEvent,
      ),
      await warningsOf(
        await call("/v1/responses", permitId, {
          model: "demo-chat",
          input: "an agent's call",
          max_output_tokens: 16,
          stream: true,
        }),
        lastEvent,
      ),
      await warningsOf(
        await call("/v1/messages", permitId, { ...chatBody, stream: false }),
        lastEvent,
      ),
      await warningsOf(
        await call("/v1/messages", permitId, { ...chatBody, stream: true }),
        lastEvent,
      ),
    ];
    for (const w of answers) {
      expect(w?.code).toBe("authorization_warn_threshold_reached");
      expect(w?.authorization_id).toBe(warned.id);
      expect(BigInt(w!.used)).toBeGreaterThanOrEqual(maximum + 1n);
    }

    // Another authorization of the key, without a threshold: no warning.
    const quietStream = await call("/v1/chat/completions", quiet.permit_id, {
      ...chatBody,
      stream: true,
    });
    const quietLast = chatSse(sseData(await quietStream.text()));
    expect(quietLast.x_gateway.request_id).toBe(quietStream.headers.get("x-gateway-request-id"));
    expect("budget_warning" in quietLast.x_gateway).toBe(false);

    await ledgerSettled(warned.id);
    // What the threshold is measured on is what the cap counts, charged and held: with every
    // request closed for less than its maximum the day's use is back below it, and a request
    // held open takes it over again.
    const closed = (await listing()).find((a) => a.id === warned.id)!;
    expect(closed.warn_at).toBe((maximum + 1n).toString());
    const dayCharged = BigInt(closed.period_used);
    expect(closed.warn_reached).toBe(dayCharged >= maximum + 1n);
    expect(dayCharged).toBe(BigInt(closed.credits_used));
    fake.setOptions({ stallBeforeHeadersMs: 60_000 });
    const held = call("/v1/chat/completions", permitId, chatBody);
    await eventually(async () => {
      const a = (await listing()).find((x) => x.id === warned.id)!;
      return a.credits_reserved !== "0";
    });
    const listed = (await listing()).find((a) => a.id === warned.id)!;
    expect(listed).toMatchObject({
      period_used: (dayCharged + maximum).toString(),
      warn_reached: true,
    });
    fake.setOptions({ stallBeforeHeadersMs: 0 });
    fake.releaseHolds();
    expect((await held).headers.get("x-gateway-budget-warning")).not.toBeNull();
    expect((await listing()).find((a) => a.id === quiet.id)).toMatchObject({
      warn_at: "0",
      warn_reached: false,
    });
    // The second chat completion, the five answers after it and the one held open.
    expect(await metric("gateway_budget_warnings_total", "day")).toBe(7);
    expect(await metric("gateway_budget_thresholds_crossed_total", "day")).toBe(1);
  });
});

/**
 * The crossing is counted once per period across processes: two pools (two processes' worth of
 * connections) measuring the same crossed authorization together find exactly one crossing.
 */
describeIfPostgres("a soft threshold's crossing, across processes", () => {
  const test = useTestDatabase();
  let other: pg.Pool;
  beforeAll(async () => {
    other = new pg.Pool({ connectionString: test.url!, max: 8 });
    // The database dropped (FORCE) at the end may still reach an idle client of this pool with
    // 57P01: pg-pool re-emits it on the pool, where it must not be an uncaught error.
    other.on("error", () => undefined);
  });
  afterAll(async () => {
    await other?.end();
  });

  it("marks exactly one of many concurrent measures as the crossing, and again once the period rolls over", async () => {
    const key = await createApiKey(test.db.pool, "warned");
    const id = `pauth_${randomBytes(12).toString("hex")}`;
    const authorization = {
      id,
      apiKeyId: key.id,
      payer: `0x${"aa".repeat(20)}`,
      permitId: hex32().toLowerCase() as Hex,
      expiresAt: NOW + 30 * 86_400,
      issuedAt: NOW,
      totalCap: 0n,
      perRequestCap: 0n,
      period: "day",
      periodCap: 1_000n,
      warnAt: 500n,
      createdAt: NOW,
      revokedAt: null,
      revokedBy: null,
    } as const;
    await insertPermitAuthorization(test.db.pool, authorization, {
      nonce: "n-warned",
      signature: `0x${"11".repeat(65)}`,
    });
    await test.db.pool.query(
      `INSERT INTO authorization_ledgers (authorization_id, total_cap, period, period_cap,
         period_start, period_used, period_reserved)
       VALUES ($1, 0, 'day', 1000, 86400, 300, 100)`,
      [id],
    );
    const a = createAuthorizationThresholds(test.db.pool);
    const b = createAuthorizationThresholds(other);
    expect(await a.measure(id, 500n)).toEqual({ used: 400n, crossed: false });
    await test.db.pool.query(
      "UPDATE authorization_ledgers SET period_reserved = 250 WHERE authorization_id = $1",
      [id],
    );
    const measures = await Promise.all(
      Array.from({ length: 16 }, (_, i) => (i % 2 === 0 ? a : b).measure(id, 500n)),
    );
    expect(measures.filter((m) => m!.crossed)).toHaveLength(1);
    expect(measures.every((m) => m!.used === 550n)).toBe(true);
    // The next day's admission starts the period over: crossing it again counts again.
    await test.db.pool.query(
      `UPDATE authorization_ledgers SET period_start = 172800, period_used = 0,
         period_reserved = 600 WHERE authorization_id = $1`,
      [id],
    );
    expect(await b.measure(id, 500n)).toEqual({ used: 600n, crossed: true });
    expect(await a.measure(id, 500n)).toEqual({ used: 600n, crossed: false });
  });
});
