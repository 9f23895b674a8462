import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { anyPermit, type PermitAuthorization } from "../../domain/permit-authorization/index.js";
import { createApiKey } from "./api-keys.js";
import {
  findApiKeyWithAuthorizations,
  insertPermitAuthorization,
  listPayerAuthorizations,
  listPermitAuthorizations,
  revokePayerAuthorizations,
  revokePermitAuthorization,
} from "./permit-authorizations.js";

const now = 1_800_000_000;
const payer = `0x${"aa".repeat(20)}` as Hex;
const proof = (nonce: string) => ({ nonce, signature: `0x${"11".repeat(65)}` as Hex });

const test = useTestDatabase();

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
    period: "" as const,
    periodCap: 0n,
    warnAt: 0n,
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

  describe("a payer's control without the key (issue 28, migration 028)", () => {
    const other = `0x${"cc".repeat(20)}` as Hex;
    const permitA = `0x${"0a".repeat(32)}` as Hex;
    let n = 100;
    const make = async (
      apiKeyId: string,
      overrides: Partial<PermitAuthorization> = {},
    ): Promise<PermitAuthorization> => {
      const a = row(apiKeyId, ++n, { payer: other, ...overrides });
      expect(await insertPermitAuthorization(test.db.pool, a, proof(`p${n}`))).toBe("inserted");
      return a;
    };

    it("lists the payer's authorizations of every key, newest first, by pages", async () => {
      const k1 = await createApiKey(test.db.pool, "payer list 1");
      const k2 = await createApiKey(test.db.pool, "payer list 2");
      const a1 = await make(k1.id);
      const a2 = await make(k2.id, { permitId: permitA });
      const a3 = await make(k1.id);
      // Another payer's, on the same key: not listed.
      await make(k1.id, { payer: payer });
      const ids = async (page: { limit: number; startingAfter?: string }) =>
        (await listPayerAuthorizations(test.db.pool, other, page)).map((a) => a.id);
      expect(await ids({ limit: 10 })).toEqual([a3.id, a2.id, a1.id]);
      expect(await ids({ limit: 2 })).toEqual([a3.id, a2.id]);
      expect(await ids({ limit: 2, startingAfter: a2.id })).toEqual([a1.id]);
      // An id of another payer's names no place in this payer's list.
      expect(await ids({ limit: 2, startingAfter: `pauth_${"f".repeat(24)}` })).toEqual([]);
    });

    it("revokes by key, by permit and all (issued at or before `before`); all raises the epoch, never lowers it, and refuses what was issued at or before it", async () => {
      const payerC = `0x${"dd".repeat(20)}` as Hex;
      const k1 = await createApiKey(test.db.pool, "payer revoke 1");
      const k2 = await createApiKey(test.db.pool, "payer revoke 2");
      const a = await make(k1.id, { payer: payerC, issuedAt: now - 10 });
      const b = await make(k2.id, { payer: payerC, issuedAt: now - 10, permitId: permitA });
      const c = await make(k2.id, { payer: payerC, issuedAt: now - 10 });
      const later = await make(k1.id, { payer: payerC, issuedAt: now + 5 });

      const byKey = await revokePayerAuthorizations(test.db.pool, {
        payer: payerC,
        apiKeyId: k1.id,
        before: now,
        now,
      });
      // `later` was issued after `before`: kept.
      expect(byKey).toEqual({
        revoked: [{ ...a, revokedAt: now, revokedBy: "payer" }],
        epoch: null,
        revokedBefore: now,
      });
      const byPermit = await revokePayerAuthorizations(test.db.pool, {
        payer: payerC,
        permitId: permitA,
        before: now,
        now,
      });
      expect(byPermit.revoked.map((x) => x.id)).toEqual([b.id]);

      const all = await revokePayerAuthorizations(test.db.pool, {
        payer: payerC,
        before: now,
        now: now + 1,
      });
      expect(all).toEqual({
        revoked: [{ ...c, revokedAt: now + 1, revokedBy: "payer" }],
        epoch: now,
        revokedBefore: now,
      });
      // An older "all" replayed: the epoch stays, nothing more is revoked.
      expect(
        await revokePayerAuthorizations(test.db.pool, {
          payer: payerC,
          before: now - 100,
          now: now + 2,
        }),
      ).toEqual({ revoked: [], epoch: now, revokedBefore: now - 100 });
      // Issued at or before the epoch: refused; after it: stored.
      expect(
        await insertPermitAuthorization(
          test.db.pool,
          row(k1.id, ++n, { payer: payerC, issuedAt: now }),
          proof("after-all-1"),
        ),
      ).toBe("revoked");
      expect(
        await insertPermitAuthorization(
          test.db.pool,
          row(k1.id, ++n, { payer: payerC, issuedAt: now + 1 }),
          proof("after-all-2"),
        ),
      ).toBe("inserted");
      const live = await findApiKeyWithAuthorizations(test.db.pool, k1.key, now);
      expect(live!.authorizations.map((x) => x.id).sort()).toEqual(
        [later.id, row(k1.id, n).id].sort(),
      );
    });

    it("the key lookup leaves out an authorization issued at or before its payer's epoch, however it was stored", async () => {
      const payerE = `0x${"ee".repeat(20)}` as Hex;
      const key = await createApiKey(test.db.pool, "epoch lookup");
      await revokePayerAuthorizations(test.db.pool, {
        payer: payerE,
        before: now,
        now,
      });
      // Written as an older gateway would have, without reading the epoch.
      await test.db.pool.query(
        `INSERT INTO permit_authorizations
           (id, api_key_id, payer, permit_id, expires_at, nonce, signature, created_at, issued_at)
         VALUES ($1, $2, $3, $4, $5, 'raw', '0x', $6, $6)`,
        [`pauth_${"e".repeat(24)}`, key.id, payerE, anyPermit, now + 60, now],
      );
      const fresh = row(key.id, ++n, { payer: payerE, issuedAt: now + 1 });
      expect(await insertPermitAuthorization(test.db.pool, fresh, proof("fresh"))).toBe("inserted");
      expect(await findApiKeyWithAuthorizations(test.db.pool, key.key, now)).toEqual({
        id: key.id,
        authorizations: [fresh],
      });
    });

    it("a revocation by key or by permit raises that scope's epoch: an AuthorizeKey signed before it is refused when submitted after it (issue 37)", async () => {
      const payerS = `0x${"5c".repeat(20)}` as Hex;
      const permitB = `0x${"0b".repeat(32)}` as Hex;
      const k = await createApiKey(test.db.pool, "scoped k");
      const j = await createApiKey(test.db.pool, "scoped j");
      const insert = (apiKeyId: string, issuedAt: number, permitId: Hex, nonce: string) =>
        insertPermitAuthorization(
          test.db.pool,
          row(apiKeyId, ++n, { payer: payerS, issuedAt, permitId }),
          proof(nonce),
        );
      // `revoke --key K` at `now`: nothing of K's was stored yet.
      expect(
        await revokePayerAuthorizations(test.db.pool, {
          payer: payerS,
          apiKeyId: k.id,
          before: now,
          now,
        }),
      ).toEqual({ revoked: [], epoch: null, revokedBefore: now });
      // Signed before it (issued at or before `now`), submitted after it: refused, any permit.
      expect(await insert(k.id, now - 30, anyPermit, "k-before-any")).toBe("revoked");
      expect(await insert(k.id, now, permitB, "k-at-b")).toBe("revoked");
      // Another key, or issued after the revocation: stored.
      expect(await insert(j.id, now - 30, anyPermit, "j-before")).toBe("inserted");
      expect(await insert(k.id, now + 1, anyPermit, "k-after")).toBe("inserted");

      // `revoke --permit B`: authorizations naming B exactly, whatever key.
      await revokePayerAuthorizations(test.db.pool, {
        payer: payerS,
        permitId: permitB,
        before: now + 10,
        now: now + 10,
      });
      expect(await insert(j.id, now + 5, permitB, "j-b")).toBe("revoked");
      // Of every permit, or of another permit: not covered by a revocation of B.
      expect(await insert(j.id, now + 5, anyPermit, "j-any")).toBe("inserted");
      expect(await insert(j.id, now + 5, permitA, "j-a")).toBe("inserted");
      // Replaying an older revocation lowers nothing.
      await revokePayerAuthorizations(test.db.pool, {
        payer: payerS,
        apiKeyId: k.id,
        before: now - 100,
        now: now + 11,
      });
      expect(await insert(k.id, now, anyPermit, "k-again")).toBe("revoked");
      const { rows } = await test.db.pool.query(
        "SELECT api_key_id, permit_id, epoch::int FROM payer_scope_epochs WHERE payer = $1 ORDER BY epoch",
        [payerS],
      );
      expect(rows).toEqual([
        { api_key_id: k.id, permit_id: anyPermit, epoch: now },
        { api_key_id: "", permit_id: permitB, epoch: now + 10 },
      ]);
    });

    it("the key lookup leaves out an authorization a scope's epoch covers, however it was stored", async () => {
      const payerL = `0x${"5d".repeat(20)}` as Hex;
      const key = await createApiKey(test.db.pool, "scope lookup");
      await revokePayerAuthorizations(test.db.pool, {
        payer: payerL,
        apiKeyId: key.id,
        before: now,
        now,
      });
      await test.db.pool.query(
        `INSERT INTO permit_authorizations
           (id, api_key_id, payer, permit_id, expires_at, nonce, signature, created_at, issued_at)
         VALUES ($1, $2, $3, $4, $5, 'raw-scope', '0x', $6, $6)`,
        [`pauth_${"d".repeat(24)}`, key.id, payerL, anyPermit, now + 60, now],
      );
      expect(await findApiKeyWithAuthorizations(test.db.pool, key.key, now)).toEqual({
        id: key.id,
        authorizations: [],
      });
    });

    it("a revocation by key racing inserts: every authorization of the key issued at or before it ends refused or marked revoked", async () => {
      const payerK = `0x${"ac".repeat(20)}` as Hex;
      const key = await createApiKey(test.db.pool, "scoped race");
      const inserts = Array.from({ length: 40 }, (_, i) =>
        insertPermitAuthorization(
          test.db.pool,
          row(key.id, 2000 + i, { payer: payerK, issuedAt: now }),
          proof(`scoped-race-${i}`),
        ),
      );
      const revocation = revokePayerAuthorizations(test.db.pool, {
        payer: payerK,
        apiKeyId: key.id,
        before: now,
        now,
      });
      const outcomes = await Promise.all(inserts);
      const { revoked } = await revocation;
      const inserted = outcomes.filter((o) => o === "inserted").length;
      expect(inserted + outcomes.filter((o) => o === "revoked").length).toBe(40);
      expect(revoked.length).toBe(inserted);
      const { rows } = await test.db.pool.query<{ n: string }>(
        "SELECT count(*) AS n FROM permit_authorizations WHERE payer = $1 AND revoked_at IS NULL",
        [payerK],
      );
      expect(rows[0]!.n).toBe("0");
    });

    it("a revoke all racing inserts: every authorization issued at or before the epoch ends refused or marked revoked", async () => {
      const payerR = `0x${"ab".repeat(20)}` as Hex;
      const key = await createApiKey(test.db.pool, "race");
      const inserts = Array.from({ length: 40 }, (_, i) =>
        insertPermitAuthorization(
          test.db.pool,
          row(key.id, 1000 + i, { payer: payerR, issuedAt: now }),
          proof(`race-${i}`),
        ),
      );
      const revocation = revokePayerAuthorizations(test.db.pool, {
        payer: payerR,
        before: now,
        now,
      });
      const outcomes = await Promise.all(inserts);
      const { revoked } = await revocation;
      const inserted = outcomes.filter((o) => o === "inserted").length;
      expect(inserted + outcomes.filter((o) => o === "revoked").length).toBe(40);
      // Every stored one was marked by the revocation.
      expect(revoked.length).toBe(inserted);
      const { rows } = await test.db.pool.query<{ n: string }>(
        "SELECT count(*) AS n FROM permit_authorizations WHERE payer = $1 AND revoked_at IS NULL",
        [payerR],
      );
      expect(rows[0]!.n).toBe("0");
    });
  });
});
