import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAnvil, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { startGateway } from "../src/app.js";
import { parseConfig } from "../src/config.js";
import { createLogger } from "../src/runtime/logger.js";
import { useTestDatabase } from "./helpers/db.js";

describe("startup checks", () => {
  let anvil: AnvilInstance;
  const database = useTestDatabase();
  beforeAll(async () => {
    anvil = await startAnvil({ chainId: 31337 });
  });
  afterAll(async () => {
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

  it("refuses a tokenizer registry (TOKENIZER_REGISTRY) whose file does not match its SHA-256", async () => {
    const dir = mkdtempSync(join(tmpdir(), "startup-tokenizers-"));
    try {
      writeFileSync(join(dir, "chat.jinja"), "{{ messages[0].content }}");
      writeFileSync(join(dir, "tokenizer.json"), "{}");
      const registry = join(dir, "registry.json");
      const pinned = "0".repeat(64);
      writeFileSync(
        registry,
        JSON.stringify({
          tokenizers: {
            mine: {
              tokenizer: "./tokenizer.json",
              sha256: pinned,
              chatTemplate: "./chat.jinja",
              templateSha256: pinned,
            },
          },
          models: [{ repository: "acme/*", tokenizer: "mine" }],
        }),
      );
      await expect(
        startGateway(config({ TOKENIZER_REGISTRY: registry }), {
          logger: createLogger("silent"),
          database: database.db,
        }),
      ).rejects.toThrow(
        `tokenizer file ${join(dir, "tokenizer.json")} for "mine" has sha256 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a, the registry ${registry} pins ${pinned}`,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
