import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { describeIfPostgres, useTestDatabase } from "../../../test/helpers/db.js";
import { startFaultProxy, type FaultProxy } from "../../../test/helpers/fault-proxy.js";
import { eventually } from "../../../test/helpers/stack.js";
import { createApiKey, revokeApiKey } from "./api-keys.js";
import {
  createPgAuthoritySignals,
  parseAuthoritySignal,
  type AuthoritySignal,
} from "./authority-signals.js";
import { insertPermitAuthorization, revokePermitAuthorization } from "./permit-authorizations.js";

describe("authority signal payloads", () => {
  it("reads key:<id> and all, and nothing else", () => {
    expect(parseAuthoritySignal("key:key_0123")).toEqual({ key: "key_0123" });
    expect(parseAuthoritySignal("all")).toBe("all");
    for (const other of [undefined, "", "key:", "ALL", "keys:x", "{}"]) {
      expect(parseAuthoritySignal(other)).toBeUndefined();
    }
  });
});

describeIfPostgres("authority signals on PostgreSQL (migration 029's triggers, LISTEN)", () => {
  const test = useTestDatabase();
  let proxy: FaultProxy;
  let session: pg.Pool;
  const heard: AuthoritySignal[] = [];
  const states: boolean[] = [];
  let signals: ReturnType<typeof createPgAuthoritySignals>;

  beforeAll(async () => {
    const url = new URL(test.url!);
    proxy = await startFaultProxy({ host: url.hostname, port: Number(url.port || 5432) });
    session = new pg.Pool({ connectionString: proxy.url(test.url!), max: 1 });
    session.on("error", () => undefined);
    signals = createPgAuthoritySignals(
      { session },
      {
        onSignal: (signal) => heard.push(signal),
        onState: (up) => states.push(up),
        heartbeatMs: 200,
        maxRetryMs: 400,
      },
    );
    await signals.ready();
  });
  afterAll(async () => {
    await signals?.close();
    await session?.end();
    await proxy?.close();
  });

  const heardSince = async (from: number, expected: AuthoritySignal[]) => {
    await eventually(async () => heard.length >= from + expected.length, 2000, 10);
    await new Promise((r) => setTimeout(r, 50)); // and nothing more
    expect(heard.slice(from)).toEqual(expected);
  };

  it("hears every writer: a key's authorization made, revoked, the key revoked (once per commit), a truncate", async () => {
    expect(signals.up).toBe(true);
    expect(states).toEqual([false, true]);
    expect(heard).toEqual(["all"]); // on coming up: read everything afresh
    const { pool } = test.db;
    const key = await createApiKey(pool, "signals");
    // Issued with its check: no signal (nothing can hold a key that did not exist).
    await heardSince(1, []);

    const authorization = {
      id: "pauth_000000000000000000000001",
      apiKeyId: key.id,
      payer: `0x${"aa".repeat(20)}` as const,
      permitId: `0x${"00".repeat(32)}` as const,
      expiresAt: 2_000_000_000,
      issuedAt: 1_700_000_000,
      totalCap: 0n,
      perRequestCap: 0n,
      period: "" as const,
      periodCap: 0n,
      warnAt: 0n,
      createdAt: 1_700_000_000,
      revokedAt: null,
      revokedBy: null,
    };
    await insertPermitAuthorization(pool, authorization, { nonce: "n1", signature: "0x01" });
    await heardSince(1, [{ key: key.id }]);
    await revokePermitAuthorization(pool, {
      id: authorization.id,
      now: 1_700_000_001,
      by: "payer",
    });
    await heardSince(2, [{ key: key.id }]);
    // Several changes of one key in one transaction: one signal, at its commit.
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("UPDATE api_keys SET name = 'renamed' WHERE id = $1", [key.id]);
      await client.query(
        "UPDATE permit_authorizations SET expires_at = expires_at + 1 WHERE api_key_id = $1",
        [key.id],
      );
      await new Promise((r) => setTimeout(r, 100));
      expect(heard.length).toBe(3); // nothing before the commit
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    await heardSince(3, [{ key: key.id }]);
    expect(await revokeApiKey(pool, key.id)).toBe(true);
    await heardSince(4, [{ key: key.id }]);
    // A key written without its check (an older release): everyone reads the hashes again.
    await pool.query(
      "INSERT INTO api_keys (id, name, key_hash, prefix) VALUES ('key_old', 'old', '\\x00', 'gw_old')",
    );
    await heardSince(5, ["all"]);
    await pool.query("TRUNCATE permit_authorizations CASCADE");
    await heardSince(6, ["all"]);
  });

  it("a connection that goes silent is given up (down), and once the route is back it is up again and says all", async () => {
    const from = heard.length;
    const stateFrom = states.length;
    proxy.blackhole();
    await eventually(async () => !signals.up, 3000, 20);
    expect(states.slice(stateFrom)).toEqual([false]);
    proxy.pass();
    await eventually(async () => signals.up, 5000, 20);
    expect(states.slice(stateFrom)).toEqual([false, true]);
    await heardSince(from, ["all"]);
    // And it hears again.
    const key = await createApiKey(test.db.pool, "after");
    await revokeApiKey(test.db.pool, key.id);
    await heardSince(from + 1, [{ key: key.id }]);
  });
});
