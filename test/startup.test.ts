import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAnvil, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { startGateway } from "../src/app.js";
import { parseConfig } from "../src/config.js";
import { createLogger } from "../src/logger.js";
import { createTestDatabase, type TestDatabase } from "./helpers/db.js";

describe("startup checks", () => {
  let anvil: AnvilInstance;
  let database: TestDatabase;
  beforeAll(async () => {
    anvil = await startAnvil({ chainId: 31337 });
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await database?.drop();
    await anvil?.stop();
  });

  const config = (overrides: Record<string, string>) =>
    parseConfig({
      RPC_URL: anvil.rpcUrl,
      CHAIN_ID: "31337",
      MARKET_ADDRESS: "0x5FbDB2315678afecb367f032d93F642f64180aa3",
      SETTLEMENT_OPERATOR_TOKEN: "operator-token-for-tests",
      PORT: "0",
      HOST: "127.0.0.1",
      ...overrides,
    });

  it("refuses a chain whose id differs from CHAIN_ID", async () => {
    await expect(
      startGateway(config({ CHAIN_ID: "1" }), {
        logger: createLogger("silent"),
        database: database.db,
      }),
    ).rejects.toThrow(/serves chain 31337, but CHAIN_ID is 1/);
  });

  it("refuses a market address without a contract", async () => {
    await expect(
      startGateway(config({}), { logger: createLogger("silent"), database: database.db }),
    ).rejects.toThrow(/no contract at MARKET_ADDRESS/);
  });
});
