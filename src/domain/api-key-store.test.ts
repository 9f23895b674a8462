import { hash, randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { newApiKey, randomBase62 } from "./api-key-check.js";
import { createApiKeyStore, type ApiKeyLookup } from "./api-key-store.js";
import { createKeyAuthorities, type PermitAuthorization } from "./permit-authorization/index.js";

const secret = randomBytes(32);
const digest = (key: string) => hash("sha256", key, "base64");

/** A database of keys (by plaintext here), counting the lookups it answers. */
function fakeLookup(keys: Map<string, { id: string; checked: boolean }>) {
  let finds = 0;
  let loads = 0;
  let gate: Promise<void> | undefined;
  const lookup: ApiKeyLookup = {
    async find(key) {
      finds++;
      await gate;
      const row = keys.get(key);
      return row === undefined ? null : { id: row.id, authorizations: [] as PermitAuthorization[] };
    },
    async uncheckedKeyHashes() {
      loads++;
      return [...keys].filter(([, r]) => !r.checked).map(([k]) => digest(k));
    },
  };
  return {
    lookup,
    finds: () => finds,
    loads: () => loads,
    hold(): () => void {
      let release!: () => void;
      gate = new Promise((r) => (release = r));
      return () => {
        gate = undefined;
        release();
      };
    },
  };
}

async function storeWith(keys: Map<string, { id: string; checked: boolean }>, maxMissing = 100) {
  const db = fakeLookup(keys);
  const store = createApiKeyStore({
    secret,
    lookup: db.lookup,
    authorities: createKeyAuthorities({ ttlMs: 60_000 }),
    ttlMs: 60_000,
    clock: () => 1_800_000_000,
    maxMissing,
  });
  await store.loadUncheckedKeys();
  return { store, db };
}

describe("API key store: unknown keys cost nothing", () => {
  it("finds an issued key once, then from memory", async () => {
    const key = newApiKey(secret);
    const { store, db } = await storeWith(new Map([[key, { id: "key_1", checked: true }]]));
    expect(store.plausible(key)).toBe(true);
    expect((await store.find(key))?.id).toBe("key_1");
    expect((await store.find(key))?.id).toBe("key_1");
    expect(db.finds()).toBe(1);
  });

  it("refuses made-up keys of any form without a lookup", async () => {
    const { store, db } = await storeWith(new Map());
    for (let i = 0; i < 1000; i++) {
      for (const key of [`gw_${randomBase62(40)}`, randomBase62(20), `gw_${randomBase62(12)}`]) {
        expect(store.plausible(key)).toBe(false);
        expect(await store.find(key)).toBeNull();
      }
    }
    expect(db.finds()).toBe(0);
  });

  it("keys issued before the check: found by their held hash; others of their shape refused without a lookup", async () => {
    const old = `gw_${randomBase62(40)}`;
    const { store, db } = await storeWith(new Map([[old, { id: "key_old", checked: false }]]));
    expect(store.plausible(old)).toBe(true);
    expect((await store.find(old))?.id).toBe("key_old");
    expect(await store.find(`gw_${randomBase62(40)}`)).toBeNull();
    expect(db.finds()).toBe(1);
  });

  it("a revoked key costs one lookup, then none; the missing are bounded, least recently asked first out", async () => {
    const revoked = Array.from({ length: 5 }, () => newApiKey(secret));
    const { store, db } = await storeWith(new Map(), 3);
    for (const key of revoked.slice(0, 3)) expect(await store.find(key)).toBeNull();
    expect(db.finds()).toBe(3);
    for (let i = 0; i < 10; i++) for (const key of revoked.slice(0, 3)) await store.find(key);
    expect(db.finds()).toBe(3);
    expect(store.plausible(revoked[0]!)).toBe(false);
    // Asked again, the first is the most recent; two more push the second and third out.
    await store.find(revoked[0]!);
    await store.find(revoked[3]!);
    await store.find(revoked[4]!);
    expect(store.missingSize).toBe(3);
    expect(db.finds()).toBe(5);
    await store.find(revoked[0]!);
    expect(db.finds()).toBe(5);
    await store.find(revoked[1]!);
    expect(db.finds()).toBe(6);
  });

  it("concurrent lookups of one key share one query, unless a signal came meanwhile", async () => {
    const key = newApiKey(secret);
    const { store, db } = await storeWith(new Map([[key, { id: "key_1", checked: true }]]));
    let release = db.hold();
    const together = Promise.all(Array.from({ length: 50 }, () => store.find(key)));
    release();
    expect((await together).map((f) => f?.id)).toEqual(Array(50).fill("key_1"));
    expect(db.finds()).toBe(1);

    store.invalidate("key_1");
    release = db.hold();
    const first = store.find(key);
    store.invalidate("key_1"); // the database changed while the first lookup read it
    const second = store.find(key);
    release();
    await Promise.all([first, second]);
    expect(db.finds()).toBe(3);
  });

  it("a signal for the key makes the next request read it again; all reads the unchecked keys again too", async () => {
    const keys = new Map([[newApiKey(secret), { id: "key_1", checked: true }]]);
    const [key] = [...keys.keys()];
    const { store, db } = await storeWith(keys);
    await store.find(key!);
    store.invalidate("key_2");
    await store.find(key!);
    expect(db.finds()).toBe(1);
    store.invalidate("key_1");
    await store.find(key!);
    expect(db.finds()).toBe(2);

    // An older release issues a key without a check: `all` (its trigger's signal) loads it.
    const old = `gw_${randomBase62(40)}`;
    keys.set(old, { id: "key_old", checked: false });
    expect(await store.find(old)).toBeNull();
    expect(db.finds()).toBe(2);
    const loads = db.loads();
    store.invalidateAll();
    await store.loadUncheckedKeys();
    expect(db.loads()).toBeGreaterThan(loads);
    expect((await store.find(old))?.id).toBe("key_old");
    expect((await store.find(key!))?.id).toBe("key_1");
    expect(db.finds()).toBe(4);
  });
});
