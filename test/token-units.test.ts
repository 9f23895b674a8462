import { createTestClient, http, type Address, type Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { deployCreditToken } from "../src/adapters/chain/deploy.js";
import { createPgCatalogStore } from "../src/adapters/pg/catalog.js";
import { id32 } from "../src/dev/demo-market.js";
import { authed, eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";

// Issue 38, item 3: the indexer reads each model's credit token's decimals and symbol once per
// token, keeps only what is safe to show, and says "unknown" for a token that answers nothing
// usable. On anvil, with the gateway's indexer; PGlite, or PostgreSQL with TEST_DATABASE_URL.

const hostileSymbol = "<img src=x onerror=alert(1)>\u001b[2J";
// Code that reverts every call, and code that answers every call with 32 bytes of 0xff (a
// decimals of 2^256-1; a `bytes` whose offset points far outside the answer).
const reverting: Hex = "0x60006000fd";
const garbage: Hex = `0x7f${"ff".repeat(32)}60005260206000f3`;

describe("credit token units, indexed from the chain", () => {
  let stack: TestStack;
  beforeAll(async () => {
    stack = await startTestStack();
  });
  afterAll(async () => {
    await stack?.close();
  });

  const creator = () => stack.clients.wallet(stack.roles.creator.privateKey);
  const createModel = async (
    label: string,
    token: Address,
  ): Promise<{ id: Hex; block: bigint }> => {
    const id = id32(`model:units:${label}`);
    const hash = await creator().writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "createModel",
      args: [id, token, `org/${label}`, "v1", "chat", id32(`pool:units:${label}`), 1n],
    });
    const receipt = await stack.clients.publicClient.waitForTransactionReceipt({ hash });
    return { id, block: receipt.blockNumber };
  };
  const indexedTo = async (block: bigint) =>
    eventually(async () => {
      const result = await stack.gateway.indexer.syncOnce().catch(() => undefined);
      const { rows } = await stack.database.db.pool.query<{ block_number: string }>(
        "SELECT block_number FROM chain_cursors WHERE name = 'market'",
      );
      return result === undefined && BigInt(rows[0]!.block_number) >= block;
    }, 15_000);
  const store = () => createPgCatalogStore(stack.database.db.pool);
  const tokenRow = async (token: Address) =>
    (
      await stack.database.db.pool.query<{
        decimals: number | null;
        symbol: string | null;
        read_block: string;
      }>("SELECT decimals, symbol, read_block FROM credit_tokens WHERE token = $1", [
        token.toLowerCase(),
      ])
    ).rows;

  it("reads a demo model's token: 18 decimals, its symbol", async () => {
    const model = await store().getModel(stack.demo.models[0]!.modelId);
    expect(model?.creditTokenDecimals).toBe(18);
    expect(model?.creditTokenSymbol).toBe("DCHAT");
  });

  it("bounds a hostile symbol, says unknown for a token that does not answer, reads once", async () => {
    const testClient = createTestClient({
      mode: "anvil",
      chain: stack.clients.chain,
      transport: http(stack.anvil.rpcUrl),
    });
    const hostile = await deployCreditToken(creator(), stack.clients.publicClient, {
      name: "hostile",
      symbol: hostileSymbol,
      owner: stack.roles.creator.address,
    });
    const silent: Address = `0x${"5e".repeat(20)}`;
    const noCode: Address = `0x${"5f".repeat(20)}`;
    const junk: Address = `0x${"6a".repeat(20)}`;
    await testClient.setCode({ address: silent, bytecode: reverting });
    await testClient.setCode({ address: junk, bytecode: garbage });

    const a = await createModel("hostile", hostile);
    const b = await createModel("silent", silent);
    const c = await createModel("no-code", noCode);
    const d = await createModel("junk", junk);
    await indexedTo(d.block);

    const hostileModel = await store().getModel(a.id);
    // The decimals are the token's own; the symbol is not shown (not stored at all).
    expect(hostileModel?.creditTokenDecimals).toBe(18);
    expect(hostileModel?.creditTokenSymbol).toBeUndefined();
    expect(await tokenRow(hostile)).toEqual([
      { decimals: 18, symbol: null, read_block: expect.any(String) },
    ]);
    // The API: base units stay, the decimals beside them; an unshowable symbol is null.
    const view = await json(await authed(stack, `/v1/models/${a.id}`));
    expect(view).toMatchObject({ credit_token_decimals: 18, credit_token_symbol: null });
    expect(JSON.stringify(view)).not.toContain("onerror");
    for (const { id } of [b, c, d]) {
      expect(await json(await authed(stack, `/v1/models/${id}`))).toMatchObject({
        credit_token_decimals: null,
        credit_token_symbol: null,
      });
      const model = await store().getModel(id);
      expect(model?.creditTokenDecimals).toBeUndefined();
      expect(model?.creditTokenSymbol).toBeUndefined();
    }
    for (const token of [silent, noCode, junk])
      expect(await tokenRow(token)).toEqual([
        { decimals: null, symbol: null, read_block: expect.any(String) },
      ]);

    // A second model of an already read token: not read again (its first row stands).
    const [first] = await tokenRow(hostile);
    const e = await createModel("hostile-again", hostile);
    await indexedTo(e.block);
    expect(await tokenRow(hostile)).toEqual([first]);
    expect((await store().getModel(e.id))?.creditTokenDecimals).toBe(18);
  });

  it("reads the tokens of models indexed before token units were (a catalog older than 040)", async () => {
    const chat = stack.demo.models[0]!;
    await stack.database.db.pool.query("DELETE FROM credit_tokens WHERE token = $1", [
      chat.creditToken.toLowerCase(),
    ]);
    expect((await store().getModel(chat.modelId))?.creditTokenSymbol).toBeUndefined();
    const testClient = createTestClient({
      mode: "anvil",
      chain: stack.clients.chain,
      transport: http(stack.anvil.rpcUrl),
    });
    await testClient.mine({ blocks: 1 });
    await indexedTo(await stack.clients.publicClient.getBlockNumber());
    const model = await store().getModel(chat.modelId);
    expect(model?.creditTokenDecimals).toBe(18);
    expect(model?.creditTokenSymbol).toBe("DCHAT");
  });
});
