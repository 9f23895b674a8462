import pg from "pg";
import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { startGateway, type Gateway } from "../../src/app.js";
import { authorizeKey, signable } from "../helpers/authorize.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { startFaultProxy, type FaultProxy } from "../helpers/fault-proxy.js";
import { auditSecret } from "../helpers/log-audit.js";
import {
  runGatewayCli,
  serveProcess,
  stopProcess,
  type GatewayProcess,
} from "../helpers/processes.js";
import { eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 28, item 4: a new permit authorization, a revocation and an API key revocation take
 * effect on every gateway process sharing the database at once (within 100 ms), whoever made
 * them: the database signals them (migration 029's triggers, LISTEN gw_authority) and each
 * process drops what it cached of the key. The processes cache keys for a minute here
 * (API_KEY_CACHE_MS=60000), so without the signals the second process would keep its answer
 * for a minute.
 *
 * PostgreSQL only: the embedded PGlite serves one connection to one process (no second process
 * to tell, and no connection to LISTEN on); there the cache time applies, and
 * test/metrics.test.ts checks that its listener gauge says so (0).
 */
const cacheMs = 60_000;
const env = { API_KEY_CACHE_MS: String(cacheMs), PERMIT_CACHE_MS: "60000" };
const messages = [{ role: "user", content: "hi" }];

describeIfPostgres("authority across processes (two gateway processes on one PostgreSQL)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let a: GatewayProcess;
  let b: GatewayProcess;
  const delays: string[] = [];

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(env));
    permitId = stack.demo.permitId;
    [a, b] = await Promise.all([serveProcess(stack, env), serveProcess(stack, env)]);
  }, 90_000);
  afterAll(async () => {
    console.log(`authority across processes, measured:\n  ${delays.join("\n  ")}`);
    await stopProcess(a);
    await stopProcess(b);
    await fake?.stop();
    await stack?.close();
  });

  const newKey = async (): Promise<{ id: string; key: string }> => {
    const created = await createApiKey(stack.database.db.pool, "fleet");
    auditSecret("api key", created.key);
    return { id: created.id, key: created.key };
  };
  const call = (base: string, key: string, path: string, init: RequestInit = {}) =>
    fetch(`${base}${path}`, {
      ...init,
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        ...(init.headers as Record<string, string>),
      },
    });
  const chat = (base: string, key: string) =>
    call(base, key, "/v1/chat/completions", {
      method: "POST",
      headers: { "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
  /** A chat's status and error code (the body read). */
  const outcome = async (res: Response): Promise<string> => {
    const body = await json(res);
    return res.status === 200 ? "200" : `${res.status} ${body.error?.code}`;
  };

  it("a permit authorization made through A: the very next request through B is admitted", async () => {
    const app = await newKey();
    // B holds the key and its (empty) authority for a minute from now.
    expect(await outcome(await chat(b.url, app.key))).toBe("403 permit_not_authorized");
    expect(await outcome(await chat(a.url, app.key))).toBe("403 permit_not_authorized");

    const sent = performance.now();
    await authorizeKey(a.url, app.key, stack.roles.payer.privateKey);
    const answered = performance.now();
    const sentToB = performance.now();
    expect(await outcome(await chat(b.url, app.key))).toBe("200");
    delays.push(
      `authorize through A: B admitted its next request, sent ${(sentToB - answered).toFixed(1)} ms after A answered (${(answered - sent).toFixed(1)} ms for the challenge and the authorization)`,
    );
  });

  it("a revocation through A (by the key, and by the payer's signature): the very next request through B is refused", async () => {
    for (const by of ["key", "payer"] as const) {
      const app = await newKey();
      const authorization = await authorizeKey(a.url, app.key, stack.roles.payer.privateKey);
      // Both hold the key and its authority for a minute from now.
      expect(await outcome(await chat(b.url, app.key))).toBe("200");
      expect(await outcome(await chat(a.url, app.key))).toBe("200");

      let answered: number;
      if (by === "key") {
        const res = await call(a.url, app.key, `/v1/permit-authorizations/${authorization.id}`, {
          method: "DELETE",
        });
        answered = performance.now();
        expect(res.status).toBe(200);
      } else {
        const challenge = await call(
          a.url,
          stack.apiKey,
          `/v1/permit-authorizations/${authorization.id}/revocation-challenge`,
          { method: "POST" },
        );
        const typed = await json(challenge);
        const signature = await privateKeyToAccount(stack.roles.payer.privateKey).signTypedData(
          signable(typed),
        );
        const res = await call(
          a.url,
          stack.apiKey,
          `/v1/permit-authorizations/${authorization.id}/revoke`,
          { method: "POST", body: JSON.stringify({ signature }) },
        );
        answered = performance.now();
        expect(res.status).toBe(200);
      }
      // Within the 100 ms the issue allows: on a loaded machine B's next request can reach it
      // before the database's notification does (alone, it is the very next one: the delay
      // printed is when B's first refusal was sent).
      let sentAt = performance.now();
      await eventually(
        async () => {
          sentAt = performance.now();
          return (await outcome(await chat(b.url, app.key))) === "403 permit_not_authorized";
        },
        100,
        5,
      );
      delays.push(
        `revocation by the ${by} through A: B refused a request sent ${(sentAt - answered).toFixed(1)} ms after A answered`,
      );
      expect(await outcome(await chat(a.url, app.key))).toBe("403 permit_not_authorized");
    }
  });

  it("an API key revoked with `gateway keys revoke`: the very next request through A and B is refused", async () => {
    const app = await newKey();
    await authorizeKey(a.url, app.key, stack.roles.payer.privateKey);
    expect(await outcome(await chat(b.url, app.key))).toBe("200");
    expect(await outcome(await chat(a.url, app.key))).toBe("200");

    const run = await runGatewayCli(["keys", "revoke", app.id], {
      PATH: process.env.PATH,
      DATABASE_URL: stack.database.url!,
      LOG_LEVEL: "warn",
    });
    const exited = performance.now();
    expect(run.code).toBe(0);
    const sentToB = performance.now();
    expect(await outcome(await chat(b.url, app.key))).toBe("401 invalid_api_key");
    delays.push(
      `API key revoked by the CLI: B refused its next request, sent ${(sentToB - exited).toFixed(1)} ms after the CLI exited`,
    );
    expect(await outcome(await chat(a.url, app.key))).toBe("401 invalid_api_key");
  });

  it("any writer: a revocation written in SQL reaches B within 100 ms (measured)", async () => {
    const samples: number[] = [];
    for (let round = 0; round < 5; round++) {
      const app = await newKey();
      const authorization = await authorizeKey(a.url, app.key, stack.roles.payer.privateKey);
      expect(await outcome(await chat(b.url, app.key))).toBe("200");
      const view = () => call(b.url, app.key, `/v1/permits/${permitId}`);
      expect((await view()).status).toBe(200);

      await stack.database.db.pool.query(
        "UPDATE permit_authorizations SET revoked_at = $2, revoked_by = 'payer' WHERE id = $1",
        [authorization.id, Math.floor(Date.now() / 1000)],
      );
      const committed = performance.now();
      let refusedAt: number | undefined;
      while (performance.now() - committed < 1000) {
        const res = await view();
        await res.arrayBuffer();
        if (res.status === 403) {
          refusedAt = performance.now();
          break;
        }
      }
      expect(refusedAt).toBeDefined();
      samples.push(refusedAt! - committed);
    }
    samples.sort((x, y) => x - y);
    delays.push(
      `revocation written in SQL: B refused from ${samples.map((s) => s.toFixed(1)).join(", ")} ms after the commit (5 rounds, polling B)`,
    );
    expect(samples.at(-1)!).toBeLessThan(100);
  });

  describeIfPostgres("while the listener cannot hear the database", () => {
    let proxy: FaultProxy;
    let session: pg.Pool;
    let c: Gateway;
    const shortCacheMs = 3000;

    beforeAll(async () => {
      // A third gateway whose session connections (migrations, LISTEN) go through a proxy the
      // test can cut, its pool directly to the database.
      const url = new URL(stack.database.url!);
      proxy = await startFaultProxy({ host: url.hostname, port: Number(url.port || 5432) });
      session = new pg.Pool({ connectionString: proxy.url(stack.database.url!), max: 2 });
      session.on("error", () => undefined); // an idle connection the proxy cut
      c = await startGateway(
        { ...stack.config, apiKeyCacheMs: shortCacheMs, reservationLeases: false },
        { logger: stack.logger, database: { ...stack.database.db, session } },
      );
    });
    afterAll(async () => {
      await c?.close();
      await session?.end();
      await proxy?.close();
    });

    const gauge = async (): Promise<number> => {
      const text = await (await fetch(c.metricsUrl)).text();
      const line = /^gateway_authority_listener_up (\S+)$/m.exec(text);
      return Number(line?.[1]);
    };

    it("says so (gateway_authority_listener_up 0), the cache time applies, and once back it reads everything afresh", async () => {
      expect(await gauge()).toBe(1);
      proxy.down();
      await eventually(async () => (await gauge()) === 0, 5000);

      const app = await newKey();
      const authorization = await authorizeKey(a.url, app.key, stack.roles.payer.privateKey);
      expect(await outcome(await chat(c.url, app.key))).toBe("200");
      const cachedAt = performance.now();
      const res = await call(a.url, app.key, `/v1/permit-authorizations/${authorization.id}`, {
        method: "DELETE",
      });
      expect(res.status).toBe(200);
      // Unheard: C serves the key as it holds it ...
      expect(await outcome(await chat(c.url, app.key))).toBe("200");
      expect(performance.now() - cachedAt).toBeLessThan(shortCacheMs);
      // ... until its cache time is over.
      await eventually(
        async () => (await outcome(await chat(c.url, app.key))) === "403 permit_not_authorized",
        shortCacheMs + 2000,
        100,
      );

      // Back: up again within the retry's bound (5 s), and a change is heard at once again.
      proxy.pass();
      await eventually(async () => (await gauge()) === 1, 8000);
      const next = await newKey();
      const second = await authorizeKey(a.url, next.key, stack.roles.payer.privateKey);
      expect(await outcome(await chat(c.url, next.key))).toBe("200");
      await call(a.url, next.key, `/v1/permit-authorizations/${second.id}`, { method: "DELETE" });
      // Heard again: within the 100 ms the signals promise (the listener's first notification
      // after a reconnect races the next request on a loaded machine).
      await eventually(
        async () => (await outcome(await chat(c.url, next.key))) === "403 permit_not_authorized",
        100,
        5,
      );
    }, 30_000);
  });
});
