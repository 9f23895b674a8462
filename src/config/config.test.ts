import { describe, expect, it } from "vitest";
import {
  ConfigError,
  parseConfig,
  parseGatewayClientConfig,
  parseSigningChainConfig,
  parseLocalConfig,
  parsePayerChainConfig,
  parseSettleConfig,
} from "../config.js";
import { auditCorpusSource } from "./audits.js";

const base = {
  RPC_URL: "http://127.0.0.1:8545",
  CHAIN_ID: "31337",
  MARKET_ADDRESS: "0x5FbDB2315678afecb367f032d93F642f64180aa3",
  SETTLEMENT_OPERATOR_TOKEN: "s3cret-operator-token-123",
};

describe("parseConfig", () => {
  it("applies documented defaults", () => {
    const config = parseConfig(base);
    expect(config).toMatchObject({
      databaseUrl: undefined,
      stateDir: ".gateway",
      chainId: 31337,
      marketAddress: "0x5fbdb2315678afecb367f032d93f642f64180aa3",
      startBlock: 0n,
      confirmations: 2,
      pollIntervalMs: 2000,
      port: 8080,
      logLevel: "info",
      bodyLimitBytes: 4194304,
      tokenizerRegistry: undefined,
    });
    expect(Object.isFrozen(config)).toBe(true);
  });

  it("caps the hidden reasoning ratio at HIDDEN_REASONING_RATIO_MAX: 8 by default, 0 to 64", () => {
    expect(parseConfig(base).hiddenReasoningRatioMax).toBe(8);
    expect(parseConfig({ ...base, HIDDEN_REASONING_RATIO_MAX: "0" }).hiddenReasoningRatioMax).toBe(
      0,
    );
    expect(parseConfig({ ...base, HIDDEN_REASONING_RATIO_MAX: "64" }).hiddenReasoningRatioMax).toBe(
      64,
    );
    expect(() => parseConfig({ ...base, HIDDEN_REASONING_RATIO_MAX: "65" })).toThrow(
      /HIDDEN_REASONING_RATIO_MAX/,
    );
  });

  it("takes TOKENIZER_REGISTRY, the operator's registry file over the embedded one", () => {
    expect(
      parseConfig({ ...base, TOKENIZER_REGISTRY: "/etc/gateway/tokenizers.json" })
        .tokenizerRegistry,
    ).toBe("/etc/gateway/tokenizers.json");
  });

  it("reports every problem at once and never echoes the operator token", () => {
    let error: unknown;
    try {
      parseConfig({
        RPC_URL: "ftp://x",
        CHAIN_ID: "abc",
        MARKET_ADDRESS: "0x12",
        SETTLEMENT_OPERATOR_TOKEN: "short-secret",
        PORT: "70000",
        START_BLOCK: "-1",
        DATABASE_URL: "mysql://db",
        LOG_LEVEL: "loud",
      });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems;
    for (const key of [
      "RPC_URL",
      "CHAIN_ID",
      "MARKET_ADDRESS",
      "SETTLEMENT_OPERATOR_TOKEN",
      "PORT",
      "START_BLOCK",
      "DATABASE_URL",
      "LOG_LEVEL",
    ]) {
      expect(problems.some((p) => p.startsWith(key))).toBe(true);
    }
    expect((error as Error).message).not.toContain("short-secret");
  });

  it("takes RECEIPT_PRIVATE_KEY (lower-cased; absent by default) and refuses a bad one without echoing it", () => {
    expect(parseConfig(base).receiptPrivateKey).toBeUndefined();
    const key = `0x${"Ab".repeat(32)}`;
    expect(parseConfig({ ...base, RECEIPT_PRIVATE_KEY: key }).receiptPrivateKey).toBe(
      key.toLowerCase(),
    );
    const n = "0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141";
    for (const bad of [`0x${"00".repeat(32)}`, n, `0x${"ab".repeat(31)}`, `${"ab".repeat(32)}`]) {
      let error: unknown;
      try {
        parseConfig({ ...base, RECEIPT_PRIVATE_KEY: bad });
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems).toEqual([
        "RECEIPT_PRIVATE_KEY must be a 0x-prefixed 32-byte hex secp256k1 private key (0 < key < n)",
      ]);
      expect((error as Error).message).not.toContain(bad.slice(4, 40));
    }
  });

  it("requires the chain settings", () => {
    expect(() => parseConfig({})).toThrow(/RPC_URL is required[\s\S]*CHAIN_ID is required/);
  });
});

describe("database behind a pooler", () => {
  it("takes DATABASE_DIRECT_URL beside DATABASE_URL, and refuses it alone or not postgres", () => {
    const key = { ENDPOINT_ENCRYPTION_KEY: "ab".repeat(32) };
    const config = parseConfig({
      ...base,
      ...key,
      DATABASE_URL: "postgres://gw@pgbouncer:6432/gw",
      DATABASE_DIRECT_URL: "postgres://gw@db:5432/gw",
    });
    expect(config.databaseUrl).toBe("postgres://gw@pgbouncer:6432/gw");
    expect(config.databaseDirectUrl).toBe("postgres://gw@db:5432/gw");
    expect(
      parseConfig({ ...base, ...key, DATABASE_URL: "postgres://db/gw" }).databaseDirectUrl,
    ).toBe(undefined);
    expect(() => parseConfig({ ...base, DATABASE_DIRECT_URL: "postgres://db/gw" })).toThrow(
      /DATABASE_DIRECT_URL needs DATABASE_URL/,
    );
    expect(() =>
      parseConfig({ ...base, ...key, DATABASE_URL: "postgres://a/gw", DATABASE_DIRECT_URL: "db" }),
    ).toThrow(/DATABASE_DIRECT_URL must be a postgres:\/\/ or postgresql:\/\/ URL/);
  });
});

describe("provider settings", () => {
  it("requires an endpoint encryption key with an external database", () => {
    expect(() => parseConfig({ ...base, DATABASE_URL: "postgres://db/gw" })).toThrow(
      /ENDPOINT_ENCRYPTION_KEY is required with DATABASE_URL/,
    );
    expect(
      parseConfig({
        ...base,
        DATABASE_URL: "postgres://db/gw",
        ENDPOINT_ENCRYPTION_KEY: "ab".repeat(32),
      }).endpointEncryptionKey,
    ).toBe("ab".repeat(32));
  });

  it("parses the probe and verification settings", () => {
    const config = parseConfig({
      ...base,
      ALLOW_PRIVATE_ENDPOINTS: "yes",
      PROBE_INTERVAL_MS: "1000",
    });
    expect(config).toMatchObject({
      allowPrivateEndpoints: true,
      probeIntervalMs: 1000,
      probeStaleMs: 2000,
      probeConcurrency: 4,
      verificationTtlSeconds: 86400,
    });
    expect(parseConfig(base).allowPrivateEndpoints).toBe(false);
    expect(() => parseConfig({ ...base, ALLOW_PRIVATE_ENDPOINTS: "maybe" })).toThrow(
      /ALLOW_PRIVATE_ENDPOINTS must be true or false/,
    );
  });

  it("holds a JSON answer to 10 output tokens a second by default (UPSTREAM_MIN_TOKENS_PER_SECOND)", () => {
    expect(parseConfig(base)).toMatchObject({
      upstreamTimeoutMs: 30_000,
      upstreamMinTokensPerSecond: 10,
    });
    expect(
      parseConfig({ ...base, UPSTREAM_MIN_TOKENS_PER_SECOND: "25" }).upstreamMinTokensPerSecond,
    ).toBe(25);
    for (const bad of ["0", "-3", "2.5", "fast"]) {
      expect(() => parseConfig({ ...base, UPSTREAM_MIN_TOKENS_PER_SECOND: bad })).toThrow(
        /UPSTREAM_MIN_TOKENS_PER_SECOND/,
      );
    }
  });
});

describe("rate limit and slow-client settings", () => {
  it("defaults to no request rate limit, 1000 streams per key and the listener limits", () => {
    expect(parseConfig(base)).toMatchObject({
      rateLimitRps: 0,
      rateLimitBurst: 0,
      maxStreamsPerKey: 1000,
      rateLimitStreamTtlMs: 10_000,
      gatewayReplicasIgnored: false,
      headersTimeoutMs: 10_000,
      bodyTimeoutMs: 30_000,
      idleTimeoutMs: 65_000,
      maxHeaderBytes: 16_384,
      maxJsonDepth: 64,
      maxJsonArrayItems: 10_000,
    });
  });

  it("parses them and refuses bad values", () => {
    expect(
      parseConfig({
        ...base,
        RATE_LIMIT_RPS: "20",
        RATE_LIMIT_BURST: "40",
        MAX_STREAMS_PER_KEY: "0",
        GATEWAY_REPLICAS: "3",
        MAX_JSON_DEPTH: "32",
      }),
    ).toMatchObject({
      rateLimitRps: 20,
      rateLimitBurst: 40,
      maxStreamsPerKey: 0,
      gatewayReplicasIgnored: true,
      maxJsonDepth: 32,
    });
    let error: unknown;
    try {
      parseConfig({
        ...base,
        RATE_LIMIT_RPS: "-1",
        RATE_LIMIT_STREAM_TTL_MS: "10",
        HEADERS_TIMEOUT_MS: "soon",
        MAX_HEADER_BYTES: "10",
        MAX_JSON_DEPTH: "1",
      });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems.join("\n");
    for (const key of [
      "RATE_LIMIT_RPS",
      "RATE_LIMIT_STREAM_TTL_MS",
      "HEADERS_TIMEOUT_MS",
      "MAX_HEADER_BYTES",
      "MAX_JSON_DEPTH",
    ])
      expect(problems).toContain(key);
  });

  it("parses the settlement fee caps as wei (bigint): 500 and 50 gwei by default; bad ones refused", () => {
    expect(parseConfig(base)).toMatchObject({
      settlementMaxFeePerGas: 500_000_000_000n,
      settlementMaxPriorityFeePerGas: 50_000_000_000n,
    });
    expect(
      parseConfig({
        ...base,
        SETTLEMENT_MAX_FEE_PER_GAS: "123456789012345678901",
        SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS: "7",
      }),
    ).toMatchObject({
      settlementMaxFeePerGas: 123456789012345678901n,
      settlementMaxPriorityFeePerGas: 7n,
    });
    for (const [key, value] of [
      ["SETTLEMENT_MAX_FEE_PER_GAS", "0"],
      ["SETTLEMENT_MAX_FEE_PER_GAS", "1.5e9"],
      ["SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS", "-1"],
    ] as const) {
      expect(() => parseConfig({ ...base, [key]: value }), `${key}=${value}`).toThrow(
        new RegExp(`${key} must be a positive integer amount of wei`),
      );
    }
    expect(() =>
      parseConfig({
        ...base,
        SETTLEMENT_MAX_FEE_PER_GAS: "100",
        SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS: "101",
      }),
    ).toThrow(/SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS must not exceed SETTLEMENT_MAX_FEE_PER_GAS/);
  });
});

describe("the commands that run without the full configuration read it here too", () => {
  it("gateway dev and the management commands: LOG_LEVEL, PORT, GATEWAY_STATE_DIR, DATABASE_URL", () => {
    expect(parseLocalConfig({})).toEqual({
      logLevel: "info",
      port: 8080,
      stateDir: ".gateway",
      databaseUrl: undefined,
      databaseDirectUrl: undefined,
    });
    expect(parseLocalConfig({ PORT: "0", GATEWAY_STATE_DIR: "/tmp/x", LOG_LEVEL: "warn" })).toEqual(
      {
        logLevel: "warn",
        port: 0,
        stateDir: "/tmp/x",
        databaseUrl: undefined,
        databaseDirectUrl: undefined,
      },
    );
    expect(() => parseLocalConfig({ PORT: "70000", LOG_LEVEL: "loud" })).toThrow(
      /LOG_LEVEL must be one of[\s\S]*PORT must be 0-65535/,
    );
  });

  it("gateway settle: the gateway's origin, the operator token, the worker's pace", () => {
    expect(
      parseSettleConfig({
        GATEWAY_URL: "https://gw.example/ignored/path",
        SETTLEMENT_OPERATOR_TOKEN: "op",
        SETTLE_MAX_REQUESTS: "50",
      }),
    ).toEqual({
      url: "https://gw.example",
      token: "op",
      intervalMs: 10_000,
      maxRequests: 50,
      logLevel: "info",
    });
    expect(() => parseSettleConfig({ GATEWAY_URL: "ftp://x", SETTLE_INTERVAL_MS: "0" })).toThrow(
      /GATEWAY_URL must be an http:\/\/ or https:\/\/ URL[\s\S]*SETTLEMENT_OPERATOR_TOKEN is required[\s\S]*SETTLE_INTERVAL_MS must be an integer from 1 to 86400000/,
    );
  });

  it("gateway permit: the chain a payer signs on (CHAIN_ID optional, checked against the RPC)", () => {
    const market = `0x${"Ab".repeat(20)}`;
    expect(
      parsePayerChainConfig({ RPC_URL: "http://127.0.0.1:8545", MARKET_ADDRESS: market }),
    ).toEqual({
      rpcUrl: "http://127.0.0.1:8545",
      chainId: undefined,
      marketAddress: market.toLowerCase(),
    });
    expect(
      parsePayerChainConfig({ RPC_URL: "https://rpc", MARKET_ADDRESS: market, CHAIN_ID: "8453" })
        .chainId,
    ).toBe(8453);
    expect(() => parsePayerChainConfig({ RPC_URL: "ws://x", CHAIN_ID: "1.5" })).toThrow(
      /RPC_URL must be an http\(s\):\/\/ URL[\s\S]*CHAIN_ID must be a positive integer[\s\S]*MARKET_ADDRESS is required/,
    );
  });

  it("the gateway a CLI command calls: URL and API key both or neither, the key never echoed", () => {
    expect(parseGatewayClientConfig({})).toBeUndefined();
    expect(
      parseGatewayClientConfig({ GATEWAY_URL: "https://gw.example", GATEWAY_API_KEY: "gw_k" }),
    ).toEqual({ baseUrl: "https://gw.example", apiKey: "gw_k" });
    const refused = (() => {
      try {
        parseGatewayClientConfig({ GATEWAY_URL: "ftp://gw" });
      } catch (error) {
        return error as ConfigError;
      }
    })();
    expect(refused?.problems).toEqual([
      "GATEWAY_URL must be an https:// URL",
      "GATEWAY_API_KEY is required with GATEWAY_URL",
    ]);
    expect(() => parseGatewayClientConfig({ GATEWAY_API_KEY: "gw_secret" })).toThrow(
      /^invalid configuration:\n {2}- GATEWAY_URL is required with GATEWAY_API_KEY$/,
    );
  });

  it("GATEWAY_URL: https://, or http:// to this machine's loopback only (issue 28: the key and the signature never cross a network in the clear)", () => {
    const accepted = [
      "https://gw.example",
      "https://10.0.0.1:8443/base",
      "http://127.0.0.1:8080",
      "http://127.1.2.3",
      "http://2130706433:9",
      "http://localhost:8080",
      "http://LOCALHOST",
      "http://[::1]:8080",
      "http://[0:0:0:0:0:0:0:1]",
    ];
    for (const url of accepted)
      expect(parseGatewayClientConfig({ GATEWAY_URL: url, GATEWAY_API_KEY: "gw_k" }), url).toEqual({
        baseUrl: url,
        apiKey: "gw_k",
      });
    const refused: [string, string][] = [
      ["http://gw.example", "GATEWAY_URL must be an https:// URL (http:// only to this machine"],
      ["http://10.0.0.1:8080", "GATEWAY_URL must be an https:// URL (http:// only to this machine"],
      ["http://128.0.0.1", "GATEWAY_URL must be an https:// URL (http:// only to this machine"],
      ["http://localhost.example", "GATEWAY_URL must be an https:// URL (http:// only"],
      ["http://[::2]", "GATEWAY_URL must be an https:// URL (http:// only to this machine"],
      ["http://[::ffff:10.0.0.1]", "GATEWAY_URL must be an https:// URL (http:// only"],
      ["ws://127.0.0.1", "GATEWAY_URL must be an https:// URL"],
      ["gw.example", "GATEWAY_URL must be an https:// URL"],
      ["https://user:pw@gw.example", "GATEWAY_URL must not carry a user or password"],
    ];
    for (const [url, problem] of refused) {
      let error: ConfigError | undefined;
      try {
        parseGatewayClientConfig({ GATEWAY_URL: url, GATEWAY_API_KEY: "gw_k" });
      } catch (e) {
        error = e as ConfigError;
      }
      expect(error?.problems, url).toHaveLength(1);
      expect(error!.problems[0], url).toContain(problem);
      expect(error!.message, url).not.toContain("pw@");
    }
  });

  it("the chain a wallet command signs for: MARKET_ADDRESS, and the chain id from RPC_URL or CHAIN_ID, never from the gateway", () => {
    const market = "0x00000000000000000000000000000000000000Aa";
    expect(parseSigningChainConfig({ CHAIN_ID: "8453", MARKET_ADDRESS: market })).toEqual({
      rpcUrl: undefined,
      chainId: 8453,
      marketAddress: market.toLowerCase(),
    });
    expect(parseSigningChainConfig({ RPC_URL: "https://rpc", MARKET_ADDRESS: market })).toEqual({
      rpcUrl: "https://rpc",
      chainId: undefined,
      marketAddress: market.toLowerCase(),
    });
    expect(() => parseSigningChainConfig({})).toThrow(
      /RPC_URL or CHAIN_ID is required[\s\S]*MARKET_ADDRESS is required/,
    );
    expect(() =>
      parseSigningChainConfig({ RPC_URL: "ws://x", CHAIN_ID: "0", MARKET_ADDRESS: "0x12" }),
    ).toThrow(
      /RPC_URL must be an http\(s\):\/\/ URL[\s\S]*CHAIN_ID must be a positive integer[\s\S]*MARKET_ADDRESS must be a 0x-prefixed 20-byte address/,
    );
  });
});

describe("tracing settings", () => {
  it("is off by default and takes the standard OpenTelemetry variables", () => {
    expect(parseConfig(base)).toMatchObject({
      otlpTracesEndpoint: undefined,
      otelServiceName: "model-market-gateway",
    });
    expect(
      parseConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/" }),
    ).toMatchObject({ otlpTracesEndpoint: "http://collector:4318/v1/traces" });
    // The signal's own endpoint is used as given, and wins.
    expect(
      parseConfig({
        ...base,
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "https://traces.example/otlp",
        OTEL_SERVICE_NAME: "gw-eu-1",
      }),
    ).toMatchObject({
      otlpTracesEndpoint: "https://traces.example/otlp",
      otelServiceName: "gw-eu-1",
    });
    expect(
      parseConfig({
        ...base,
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318",
        OTEL_SDK_DISABLED: "true",
      }).otlpTracesEndpoint,
    ).toBeUndefined();
  });

  it("refuses a URL that is not http(s) without echoing it (it may carry credentials)", () => {
    let error: unknown;
    try {
      parseConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: "grpc://user:s3cret@collector" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL",
    ]);
    expect(String((error as Error).message)).not.toContain("s3cret");
  });
});

describe("the audits' settings", () => {
  const model = `0x${"39".repeat(32)}`;
  const audited = {
    ...base,
    AUDIT_PERMITS: `${model}=0x${"a1".repeat(32)}`,
    AUDIT_API_KEY: "gk_audit_key_for_the_test",
    AUDIT_DAILY_BUDGET_PER_OFFER: "1000",
    AUDIT_DAILY_BUDGET_PER_MODEL: "5000",
  };

  it("asks the operator's corpus with AUDIT_CORPUS_DIR, else the shipped one; none without audits", () => {
    const own = parseConfig({ ...audited, AUDIT_CORPUS_DIR: "/srv/audit-corpus" }).audits;
    expect(own?.corpusDir).toBe("/srv/audit-corpus");
    expect(auditCorpusSource(own)).toBe("operator");
    expect(auditCorpusSource(parseConfig(audited).audits)).toBe("shipped");
    expect(auditCorpusSource(parseConfig(base).audits)).toBeUndefined();
  });

  it("refuses AUDIT_CORPUS_DIR or AUDIT_ANCHORS without AUDIT_PERMITS, rather than ignore them", () => {
    try {
      parseConfig({
        ...base,
        AUDIT_CORPUS_DIR: "/srv/audit-corpus",
        AUDIT_ANCHORS: `${model}=0x${"b2".repeat(32)}`,
      });
      expect.unreachable("parseConfig accepted audit settings without AUDIT_PERMITS");
    } catch (error) {
      expect((error as ConfigError).problems).toEqual([
        "AUDIT_ANCHORS needs AUDIT_PERMITS",
        "AUDIT_CORPUS_DIR needs AUDIT_PERMITS",
      ]);
    }
  });
});
