import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../../../test/helpers/db.js";
import { anyPermit, type PermitAuthorization } from "../../domain/permit-authorization.js";
import { createApiKey } from "./api-keys.js";
import {
  findApiKeyWithAuthorizations,
  insertPermitAuthorization,
  listPermitAuthorizations,
  revokePermitAuthorization,
} from "./permit-authorizations.js";

const now = 1_800_000_000;
const payer = `0x${"aa".repeat(20)}` as Hex;
const proof = (nonce: string) => ({ nonce, signature: `0x${"11".repeat(65)}` as Hex });

let test: TestDatabase;
beforeAll(async () => {
  test = await createTestDatabase();
});
afterAll(async () => {
  await test?.drop();
});

describe("permit authorizations (the table)", () => {
  const row = (apiKeyId: string, n: number, overrides: Partial<PermitAuthorization> = {}) => ({
    id: `pauth_${n.toString(16).padStart(24, "0")}`,
    apiKeyId,
    payer,
    permitId: anyPermit,
    expiresAt: now + 60,
    issuedAt: now,
    totalCap: 0n,
    perRequestCap: 0n,
    createdAt: now,
    revokedAt: null,
    revokedBy: null,
    ...overrides,
  });

  it("loads with the key only its live authorizations (not revoked, not expired at now)", async () => {
    const key = await createApiKey(test.db.pool, "lookup");
    const live = row(key.id, 1);
    await insertPermitAuthorization(test.db.pool, live, proof("n1"));
    await insertPermitAuthorization(test.db.pool, row(key.id, 2, { expiresAt: now }), proof("n2"));
    await insertPermitAuthorization(test.db.pool, row(key.id, 3), proof("n3"));
    await revokePermitAuthorization(test.db.pool, {
      id: row(key.id, 3).id,
      now,
      by: "payer",
    });
    expect(await findApiKeyWithAuthorizations(test.db.pool, key.key, now)).toEqual({
      id: key.id,
      authorizations: [live],
    });
    // All three are listed, newest first.
    expect(
      (await listPermitAuthorizations(test.db.pool, key.id)).map((a) => [a.id, a.revokedBy]),
    ).toEqual([
      [row(key.id, 3).id, "payer"],
      [row(key.id, 2).id, null],
      [live.id, null],
    ]);
  });

  it("claims a nonce once per payer, and keeps the first revocation's time and author", async () => {
    const key = await createApiKey(test.db.pool, "nonce");
    const first = row(key.id, 10);
    expect(await insertPermitAuthorization(test.db.pool, first, proof("same"))).toBe("inserted");
    expect(await insertPermitAuthorization(test.db.pool, row(key.id, 11), proof("same"))).toBe(
      "nonce_used",
    );
    // Another payer may use the same nonce string.
    expect(
      await insertPermitAuthorization(
        test.db.pool,
        row(key.id, 12, { payer: `0x${"bb".repeat(20)}` }),
        proof("same"),
      ),
    ).toBe("inserted");

    // Held by another key: not found for it.
    expect(
      await revokePermitAuthorization(test.db.pool, {
        id: first.id,
        apiKeyId: "key_other",
        now,
        by: "key",
      }),
    ).toBeUndefined();
    const revoked = await revokePermitAuthorization(test.db.pool, {
      id: first.id,
      apiKeyId: key.id,
      now: now + 1,
      by: "key",
    });
    expect(revoked).toEqual({
      ...first,
      revokedAt: now + 1,
      revokedBy: "key",
      use: { creditsUsed: 0n, creditsReserved: 0n, lastUsedAt: null },
    });
    expect(
      await revokePermitAuthorization(test.db.pool, { id: first.id, now: now + 5, by: "payer" }),
    ).toEqual(revoked);
  });
});
