import { readdirSync, readFileSync } from "node:fs";
import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import {
  parseConfig,
  parseGatewayClientConfig,
  parseLocalConfig,
  parsePayerChainConfig,
  parseSettleConfig,
} from "../config.js";
import { createLogger, redactPaths, secretFields } from "./logger.js";

/**
 * Settings whose names say key or token and that hold no secret: how long a found API key is
 * cached, how many streams an API key may hold. Anything else so named must be redacted.
 */
const notSecret = new Set([
  "apiKeyCacheMs",
  "API_KEY_CACHE_MS",
  "maxStreamsPerKey",
  "MAX_STREAMS_PER_KEY",
]);
/** A secret's name: key, token (not text's tokens, nor a tokenizer), secret, password. */
const secretName = /key|token(?!s|izer)|secret|password|credential/i;

/** Every field of every configuration src/config.ts parses (a valid environment for each). */
function configurationFields(): string[] {
  const env = {
    RPC_URL: "http://127.0.0.1:8545",
    CHAIN_ID: "31337",
    MARKET_ADDRESS: `0x${"ab".repeat(20)}`,
    SETTLEMENT_OPERATOR_TOKEN: "x".repeat(16),
    GATEWAY_URL: "http://127.0.0.1:8080",
    GATEWAY_API_KEY: "gw_key",
  };
  return [
    parseConfig(env),
    parseLocalConfig(env),
    parseSettleConfig(env),
    parsePayerChainConfig(env),
    parseGatewayClientConfig(env)!,
  ].flatMap((config) => Object.keys(config));
}

/**
 * Every environment variable src/config.ts reads (the quoted upper-case names in its source and
 * in its modules, src/config/).
 */
function environmentVariables(): string[] {
  const folder = new URL("../config/", import.meta.url);
  const source = [
    new URL("../config.ts", import.meta.url),
    ...readdirSync(folder)
      .filter((file) => file.endsWith(".ts") && !file.endsWith(".test.ts"))
      .map((file) => new URL(file, folder)),
  ]
    .map((file) => readFileSync(file, "utf8"))
    .join("\n");
  const names = new Set<string>();
  for (const m of source.matchAll(/["'`]([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)["'`]/g)) names.add(m[1]!);
  for (const m of source.matchAll(/\benv\.([A-Z][A-Z0-9_]+)/g)) names.add(m[1]!);
  return [...names];
}

describe("log redaction: one list, and the configuration's secrets are all on it", () => {
  it("names every setting that looks like a key, token, secret or password (its field and its variable)", () => {
    const fields = configurationFields();
    const variables = environmentVariables();
    // The scan finds what it must (a scan that finds nothing checks nothing).
    expect(fields).toEqual(expect.arrayContaining(["settlementPrivateKey", "token", "apiKey"]));
    expect(variables).toEqual(
      expect.arrayContaining(["RECEIPT_PRIVATE_KEY", "GATEWAY_API_KEY", "API_KEY_CACHE_MS"]),
    );
    const missing = [...fields, ...variables].filter(
      (name) => secretName.test(name) && !notSecret.has(name) && !secretFields.includes(name),
    );
    expect(missing, "secret settings the log redaction does not cover").toEqual([]);
    // URLs that may carry a password or a collector's credentials.
    for (const url of [
      "databaseUrl",
      "databaseDirectUrl",
      "otlpTracesEndpoint",
      "DATABASE_URL",
      "DATABASE_DIRECT_URL",
      "OTEL_EXPORTER_OTLP_ENDPOINT",
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]) {
      expect(secretFields).toContain(url);
    }
  });

  it("censors each of them at the top level and two objects down, and nothing else", () => {
    const lines: string[] = [];
    const logger = createLogger(
      "info",
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(chunk.toString("utf8"));
          done();
        },
      }),
    );
    const secret = (field: string, depth: number) => `s3cret-${depth}-${field}`;
    for (const field of secretFields) {
      logger.info(
        {
          [field]: secret(field, 0),
          headers: { [field]: secret(field, 1) },
          req: { headers: { [field]: secret(field, 2) } },
          apiKeyId: "key_visible",
        },
        "a record with secrets",
      );
    }
    expect(lines).toHaveLength(secretFields.length);
    for (const [i, field] of secretFields.entries()) {
      const record = JSON.parse(lines[i]!) as Record<string, unknown>;
      expect(record[field]).toBe("[redacted]");
      expect((record.headers as Record<string, unknown>)[field]).toBe("[redacted]");
      expect(
        ((record.req as Record<string, unknown>).headers as Record<string, unknown>)[field],
      ).toBe("[redacted]");
      expect(record.apiKeyId).toBe("key_visible");
      expect(lines[i]).not.toContain("s3cret");
    }
    expect(redactPaths).toHaveLength(secretFields.length * 3);
  });
});
