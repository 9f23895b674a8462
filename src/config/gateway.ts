import { isAddress, isHex, type Address, type Hex } from "viem";
import { deploymentIdPattern } from "../adapters/pg/deployment.js";
import { auditSettings, type AuditConfig } from "./audits.js";
import {
  ConfigError,
  envReader,
  type Env,
  type EnvReader,
  type LogLevel,
  logLevels,
} from "./read.js";

/**
 * The gateway's own configuration (`gateway serve`): its settings, and `parseConfig`, which
 * reads the settings checked together (connection, keys and fees, telemetry) first and then
 * the settings table, each variable with its default and bounds.
 */

/**
 * The gateway's configuration, parsed once from the environment into one
 * frozen object. Every key is documented in README.md ("Configuration").
 */
export interface Config {
  /** PostgreSQL URL; absent: embedded PGlite under `stateDir`. */
  readonly databaseUrl: string | undefined;
  /**
   * A direct PostgreSQL URL when DATABASE_URL goes through a transaction pooler (PgBouncer):
   * migrations and the lease-recall LISTEN need a session; absent: DATABASE_URL is direct.
   */
  readonly databaseDirectUrl: string | undefined;
  /** Where embedded state (PGlite data, dev manifest) lives. */
  readonly stateDir: string;
  /**
   * This environment's gateway deployment id (GATEWAY_DEPLOYMENT_ID, `dep_...`): the database's
   * must be the same, or the gateway does not start (src/adapters/pg/deployment.ts); absent: the
   * database's, with a warning.
   */
  readonly deploymentId: string | undefined;
  readonly rpcUrl: string;
  /**
   * Longest wait for one JSON-RPC answer; a call is tried 3 times (2 retries), so a slow or
   * silent RPC fails a read after about 3 times this (permits: 503 `chain_unavailable`).
   */
  readonly chainTimeoutMs: number;
  readonly chainId: number;
  readonly marketAddress: Address;
  /** First block the indexer reads when it has no cursor yet. */
  readonly startBlock: bigint;
  /** Blocks behind the head the indexer stays, so reorgs shallower than this never reach the catalog. */
  readonly confirmations: number;
  readonly pollIntervalMs: number;
  readonly catalogFile: string | undefined;
  /**
   * The operator's tokenizer registry (TOKENIZER_REGISTRY): a JSON file of tokenizers and the
   * models they count, merged over the embedded one (src/adapters/tokenizers/registry.ts);
   * absent: the embedded registry only. Its files are checked at start-up.
   */
  readonly tokenizerRegistry: string | undefined;
  readonly settlementOperatorToken: string;
  readonly host: string;
  readonly port: number;
  /** Serves `GET /metrics` on its own listener on `host` (0: a free port); absent: on `port`. */
  readonly metricsPort: number | undefined;
  readonly logLevel: LogLevel;
  readonly bodyLimitBytes: number;
  /** AES-256-GCM key for provider endpoints (64 hex chars or base64); absent: embedded default only. */
  readonly endpointEncryptionKey: string | undefined;
  /** Lets providers register loopback/private endpoints: local development and tests only. */
  readonly allowPrivateEndpoints: boolean;
  readonly probeIntervalMs: number;
  readonly probeConcurrency: number;
  /** A health read older than this probes the endpoint on demand. */
  readonly probeStaleMs: number;
  /** How long a successful verification keeps an offer eligible. */
  readonly verificationTtlSeconds: number;
  /**
   * Least time between two verification runs of one offer, across every gateway sharing the
   * database; a verify inside it answers the last run's outcome (0: runs are only shared).
   */
  readonly verifyMinIntervalSeconds: number;
  /**
   * The window of the offers' reputation (the catalog's) and of what `provider.sort` latency
   * and throughput order by: requests, timings, verification runs and flags of its last seconds.
   */
  readonly reputationWindowSeconds: number;
  /**
   * The largest hidden reasoning ratio charged (HIDDEN_REASONING_RATIO_MAX, default 8, 0 to 64;
   * 0: no hidden reasoning is charged): an offer's tariff version may declare more, and is held
   * to this. Applies only to models whose tokenizer registry entry hides reasoning
   * (docs/decisions/metering-and-tokens.md "Hidden reasoning").
   */
  readonly hiddenReasoningRatioMax: number;
  /**
   * At most one request per offer is charged the wake fee in this many seconds, and only when
   * the gateway's probe saw the endpoint asleep (docs/decisions/chat-quotes-and-money.md "Wake fees").
   */
  readonly wakeFeeWindowSeconds: number;
  /** Longest a permit read from the chain is reused (events invalidate it sooner). */
  readonly permitCacheMs: number;
  /** Deadline for a provider's response headers (a stream's; see upstreamMinTokensPerSecond). */
  readonly upstreamTimeoutMs: number;
  /**
   * The least speed a provider is held to for a non-streamed answer, in output tokens per second
   * (UPSTREAM_MIN_TOKENS_PER_SECOND, default 10): such a call may take, headers included,
   * max(upstreamTimeoutMs, priced output tokens × choices / this) before it is the provider's
   * failure (an OpenAI-compatible server sends its headers when generation ends).
   */
  readonly upstreamMinTokensPerSecond: number;
  /** Longest silence allowed between two chunks of a provider's answer. */
  readonly upstreamIdleTimeoutMs: number;
  /**
   * The longest a provider's 429 (or 503 with `Retry-After`) takes its offer out of routing,
   * whatever its `Retry-After` asks (UPSTREAM_COOLDOWN_MAX_SECONDS; docs/decisions/providers-and-routing.md
   * "Cooldowns").
   */
  readonly upstreamCooldownMaxSeconds: number;
  /** How long a 429 without a (readable) `Retry-After` takes its offer out of routing. */
  readonly upstreamCooldownDefaultSeconds: number;
  /** How long routing reuses a model's offers and endpoints (changes seen by this process drop it at once). */
  readonly routingCacheMs: number;
  /**
   * How long a verified API key is remembered, with its permit authorizations. A change made
   * anywhere on the database (a key's revocation, a permit authorization's creation or
   * revocation) is signalled by the database and applies at once; while this process cannot
   * hear the signals (`gateway_authority_listener_up` 0), within this.
   */
  readonly apiKeyCacheMs: number;
  /**
   * The longest a payer's authorization may last after its challenge (AUTHORIZATION_MAX_EXPIRY_SECONDS,
   * default 90 days): a longer expiry is refused before anything is signed or stored.
   */
  readonly authorizationMaxExpirySeconds: number;
  /**
   * x402 (issue 37): chat requests without credentials may pay per request (X402_ENABLED; only
   * with a settlement key, which settles them), with the in-flight exposure caps per payer and
   * per deployment (base units of one credit token) and how long a signature must last.
   */
  readonly x402Enabled: boolean;
  readonly x402PayerExposureCap: bigint;
  readonly x402DeploymentExposureCap: bigint;
  readonly x402MaxTimeoutSeconds: number;
  /** Blind audits (issue 39; src/config/audits.ts): undefined when off (no AUDIT_PERMITS). */
  readonly audits: AuditConfig | undefined;
  /** Settlement: the settlement operator account's key; absent, Flush answers 503 `settlement_unavailable`. */
  readonly settlementPrivateKey: Hex | undefined;
  /**
   * The key that signs usage receipts (RECEIPT_PRIVATE_KEY); absent: no receipts (their routes
   * answer 503 `receipts_unavailable`, `GET /v1/gateway` shows `receipt_signer: null`).
   */
  readonly receiptPrivateKey: Hex | undefined;
  /** Gas bound of one settlement batch (below the block gas limit). */
  readonly settlementMaxBatchGas: bigint;
  /** Blocks an attempt may wait unmined before it is replaced with higher fees. */
  readonly settlementReplaceAfterBlocks: number;
  /** Fee increase of a replacement, in percent (at least 15: geth wants 10 on both fee fields). */
  readonly settlementFeeBumpPercent: number;
  /** Most a settlement transaction offers per gas (wei), first attempt and replacements alike. */
  readonly settlementMaxFeePerGas: bigint;
  /** Most a settlement transaction tips per gas (wei); at most `settlementMaxFeePerGas`. */
  readonly settlementMaxPriorityFeePerGas: bigint;
  /** How long one flush waits for its transaction before answering `submitted` (the next flush goes on). */
  readonly settlementWaitMs: number;
  /** Charges on a closing permit must be settled this many seconds before `closableAt`. */
  readonly settlementCloseMarginSeconds: number;
  /** How often the gateway looks for charges on closing permits (and settles them). */
  readonly settlementCloseCheckMs: number;
  /** The flusher lease's length; a flusher that stops renewing it loses it after this. */
  readonly settlementLeaseSeconds: number;
  /** PostgreSQL: the server cancels a statement running longer than this. */
  readonly dbStatementTimeoutMs: number;
  /** PostgreSQL: the client gives up on a query unanswered for this long (a dead connection). */
  readonly dbQueryTimeoutMs: number;
  /** PostgreSQL: the longest wait for a free pooled connection. */
  readonly dbConnectTimeoutMs: number;
  /** Ledger writes (reservations, closes) waiting for their batch before new ones are refused. */
  readonly ledgerQueueMax: number;
  /** How long a ledger write may wait for its batch before it is refused (503, never sent). */
  readonly ledgerQueueWaitMs: number;
  /**
   * Admit plain requests against reservation leases (docs/decisions/chat-quotes-and-money.md, "Reservation leases");
   * false: every request reserves alone before its upstream call.
   */
  readonly reservationLeases: boolean;
  /** A gateway process silent this long is dead: its open requests and leases are released. */
  readonly orphanAfterSeconds: number;
  /** Between two housekeeping rounds (heartbeat, outbox, orphan rule). */
  readonly housekeepingIntervalMs: number;
  /**
   * Shutdown (SIGTERM/SIGINT): how long requests and streams in flight may finish before they
   * are cut (streams end with a `shutting_down` error event; every record is closed first).
   */
  readonly shutdownGraceMs: number;
  /** Fleet-wide requests per second per API key (0: off); each replica enforces its share. */
  readonly rateLimitRps: number;
  /** Fleet-wide burst per API key (0: one second's worth of RATE_LIMIT_RPS). */
  readonly rateLimitBurst: number;
  /** Fleet-wide concurrent chat streams per API key (0: off); each replica its share. */
  readonly maxStreamsPerKey: number;
  /** Milliseconds a dead replica's stream slots still count (docs/decisions/errors-and-rate-limits.md "Rate limits"). */
  readonly rateLimitStreamTtlMs: number;
  /**
   * Failed authentications per second a client address gets back (0: no limit), per process;
   * an address out of them is refused 429 `address_rate_limited` before its credentials are
   * examined, unless they are a key this gateway issued or the operator's token.
   */
  readonly addressRateLimitRps: number;
  /** Failed authentications an address may have in store (0: ten seconds' worth of the rate). */
  readonly addressRateLimitBurst: number;
  /** GATEWAY_REPLICAS was set: ignored (the limits are fleet-wide), warned about at start. */
  readonly gatewayReplicasIgnored: boolean;
  /** A client must send its request headers within this (slowloris); also the HTTP/2 preface. */
  readonly headersTimeoutMs: number;
  /** A request body must arrive within this after its headers (408 `request_timeout`). */
  readonly bodyTimeoutMs: number;
  /** An idle kept-alive HTTP/1 connection or HTTP/2 session is closed after this. */
  readonly idleTimeoutMs: number;
  /** Largest request header block (HTTP/1 `maxHeaderSize`, HTTP/2 `maxHeaderListSize`). */
  readonly maxHeaderBytes: number;
  /** Deepest nesting of arrays and objects in a chat or quote body (400 beyond). */
  readonly maxJsonDepth: number;
  /** Most items in one array of a chat or quote body (400 beyond). */
  readonly maxJsonArrayItems: number;
  /**
   * A client whose response has bytes waiting and that takes none of them for this long is cut
   * (its chat is cancelled, billed partial); meanwhile the relay reads nothing more from the
   * provider.
   */
  readonly clientWriteTimeoutMs: number;
  /**
   * Largest answer an Idempotency-Key keeps for replay (chunk bytes); a larger one still
   * completes and is charged once, and its replay is 409 `idempotency_result_too_large`.
   */
  readonly idempotencyMaxResultBytes: number;
  /**
   * Where spans go (OTLP/HTTP, JSON): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, or
   * OTEL_EXPORTER_OTLP_ENDPOINT + `/v1/traces`; absent (or OTEL_SDK_DISABLED): tracing is off.
   */
  readonly otlpTracesEndpoint: string | undefined;
  /** The `service.name` of the spans (OTEL_SERVICE_NAME). */
  readonly otelServiceName: string;
}

/** secp256k1's group order: a private key is an integer from 1 to n - 1. */
const secp256k1N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

function isPrivateKey(value: string): boolean {
  if (!(isHex(value, { strict: true }) && value.length === 66)) return false;
  const key = BigInt(value);
  return key > 0n && key < secp256k1N;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

/**
 * Parses the environment. Collects every problem before failing, so an
 * operator fixes a bad deployment in one pass. Never echoes secret values.
 */
export function parseConfig(env: Env): Config {
  const r = envReader(env);
  const connection = connectionSettings(r);
  const keys = keySettings(r, connection.databaseUrl);
  const telemetry = telemetrySettings(r);

  const config: Mutable<Config> = {
    databaseUrl: connection.databaseUrl,
    databaseDirectUrl: connection.databaseDirectUrl,
    stateDir: r.str("GATEWAY_STATE_DIR") ?? ".gateway",
    deploymentId: readDeploymentId(r),
    rpcUrl: connection.rpcUrl,
    chainTimeoutMs: r.int("CHAIN_TIMEOUT_MS", 10_000, 100, 600_000),
    chainId: connection.chainId,
    marketAddress: connection.market.toLowerCase() as Address,
    startBlock: connection.startBlock,
    confirmations: r.int("CONFIRMATIONS", 2, 0, 1000),
    pollIntervalMs: r.int("POLL_INTERVAL_MS", 2000, 50, 3_600_000),
    catalogFile: r.str("CATALOG_FILE"),
    tokenizerRegistry: r.str("TOKENIZER_REGISTRY"),
    settlementOperatorToken: connection.token,
    host: r.str("HOST") ?? "0.0.0.0",
    port: r.int("PORT", 8080, 0, 65535),
    metricsPort:
      r.str("METRICS_PORT") === undefined ? undefined : r.int("METRICS_PORT", 0, 0, 65535),
    logLevel: telemetry.logLevel,
    bodyLimitBytes: r.int("BODY_LIMIT_BYTES", 4 * 1024 * 1024, 1024, 1024 * 1024 * 1024),
    endpointEncryptionKey: keys.endpointEncryptionKey,
    allowPrivateEndpoints: r.bool("ALLOW_PRIVATE_ENDPOINTS", false),
    probeIntervalMs: r.int("PROBE_INTERVAL_MS", 30_000, 50, 86_400_000),
    probeConcurrency: r.int("PROBE_CONCURRENCY", 4, 1, 256),
    probeStaleMs: 0,
    verificationTtlSeconds: r.int("VERIFICATION_TTL_SECONDS", 86_400, 1, 365 * 86_400),
    verifyMinIntervalSeconds: r.int("VERIFY_MIN_INTERVAL_SECONDS", 60, 0, 86_400),
    reputationWindowSeconds: r.int("REPUTATION_WINDOW_SECONDS", 900, 60, 86_400),
    hiddenReasoningRatioMax: r.int("HIDDEN_REASONING_RATIO_MAX", 8, 0, 64),
    wakeFeeWindowSeconds: r.int("WAKE_FEE_WINDOW_SECONDS", 300, 1, 86_400),
    permitCacheMs: r.int("PERMIT_CACHE_MS", 2000, 0, 60_000),
    upstreamTimeoutMs: r.int("UPSTREAM_TIMEOUT_MS", 30_000, 100, 600_000),
    upstreamMinTokensPerSecond: r.int("UPSTREAM_MIN_TOKENS_PER_SECOND", 10, 1, 1_000_000),
    upstreamIdleTimeoutMs: r.int("UPSTREAM_IDLE_TIMEOUT_MS", 60_000, 100, 3_600_000),
    upstreamCooldownMaxSeconds: r.int("UPSTREAM_COOLDOWN_MAX_SECONDS", 300, 1, 86_400),
    upstreamCooldownDefaultSeconds: r.int("UPSTREAM_COOLDOWN_DEFAULT_SECONDS", 10, 1, 86_400),
    routingCacheMs: r.int("ROUTING_CACHE_MS", 1000, 0, 60_000),
    apiKeyCacheMs: r.int("API_KEY_CACHE_MS", 5000, 0, 300_000),
    authorizationMaxExpirySeconds: r.int(
      "AUTHORIZATION_MAX_EXPIRY_SECONDS",
      90 * 24 * 3600,
      60,
      10 * 365 * 24 * 3600,
    ),
    settlementPrivateKey: keys.settlementPrivateKey?.toLowerCase() as Hex | undefined,
    receiptPrivateKey: keys.receiptPrivateKey?.toLowerCase() as Hex | undefined,
    x402Enabled: r.bool("X402_ENABLED", true),
    x402PayerExposureCap: r.wei("X402_PAYER_EXPOSURE_CAP", 100n * 10n ** 18n),
    x402DeploymentExposureCap: r.wei("X402_DEPLOYMENT_EXPOSURE_CAP", 10_000n * 10n ** 18n),
    x402MaxTimeoutSeconds: r.int("X402_MAX_TIMEOUT_SECONDS", 300, 120, 86_400),
    audits: auditSettings(r),
    settlementMaxBatchGas: BigInt(
      r.int("SETTLEMENT_MAX_BATCH_GAS", 12_000_000, 200_000, 1_000_000_000),
    ),
    settlementReplaceAfterBlocks: r.int("SETTLEMENT_REPLACE_AFTER_BLOCKS", 3, 1, 10_000),
    settlementFeeBumpPercent: r.int("SETTLEMENT_FEE_BUMP_PERCENT", 20, 15, 1000),
    settlementMaxFeePerGas: keys.maxFeePerGas,
    settlementMaxPriorityFeePerGas: keys.maxPriorityFeePerGas,
    settlementWaitMs: r.int("SETTLEMENT_WAIT_MS", 60_000, 0, 3_600_000),
    settlementCloseMarginSeconds: r.int("SETTLEMENT_CLOSE_MARGIN_SECONDS", 600, 0, 86_400),
    settlementCloseCheckMs: r.int("SETTLEMENT_CLOSE_CHECK_MS", 5000, 50, 3_600_000),
    settlementLeaseSeconds: r.int("SETTLEMENT_LEASE_SECONDS", 30, 2, 3600),
    dbStatementTimeoutMs: r.int("DB_STATEMENT_TIMEOUT_MS", 5000, 100, 3_600_000),
    dbQueryTimeoutMs: r.int("DB_QUERY_TIMEOUT_MS", 10_000, 100, 3_600_000),
    dbConnectTimeoutMs: r.int("DB_CONNECT_TIMEOUT_MS", 5000, 100, 600_000),
    ledgerQueueMax: r.int("LEDGER_QUEUE_MAX", 4096, 1, 1_000_000),
    ledgerQueueWaitMs: r.int("LEDGER_QUEUE_WAIT_MS", 2000, 10, 600_000),
    reservationLeases: r.bool("RESERVATION_LEASES", true),
    orphanAfterSeconds: r.int("ORPHAN_AFTER_SECONDS", 60, 2, 86_400),
    housekeepingIntervalMs: r.int("HOUSEKEEPING_INTERVAL_MS", 10_000, 100, 600_000),
    shutdownGraceMs: r.int("SHUTDOWN_GRACE_MS", 10_000, 0, 600_000),
    rateLimitRps: r.int("RATE_LIMIT_RPS", 0, 0, 1_000_000),
    rateLimitBurst: r.int("RATE_LIMIT_BURST", 0, 0, 10_000_000),
    maxStreamsPerKey: r.int("MAX_STREAMS_PER_KEY", 1000, 0, 1_000_000),
    rateLimitStreamTtlMs: r.int("RATE_LIMIT_STREAM_TTL_MS", 10_000, 1000, 600_000),
    addressRateLimitRps: r.int("ADDRESS_RATE_LIMIT_RPS", 10, 0, 1_000_000),
    addressRateLimitBurst: r.int("ADDRESS_RATE_LIMIT_BURST", 100, 0, 10_000_000),
    gatewayReplicasIgnored: env.GATEWAY_REPLICAS !== undefined,
    headersTimeoutMs: r.int("HEADERS_TIMEOUT_MS", 10_000, 100, 600_000),
    bodyTimeoutMs: r.int("BODY_TIMEOUT_MS", 30_000, 100, 3_600_000),
    idleTimeoutMs: r.int("IDLE_TIMEOUT_MS", 65_000, 100, 3_600_000),
    maxHeaderBytes: r.int("MAX_HEADER_BYTES", 16 * 1024, 1024, 1024 * 1024),
    maxJsonDepth: r.int("MAX_JSON_DEPTH", 64, 2, 1000),
    maxJsonArrayItems: r.int("MAX_JSON_ARRAY_ITEMS", 10_000, 1, 10_000_000),
    clientWriteTimeoutMs: r.int("CLIENT_WRITE_TIMEOUT_MS", 30_000, 100, 3_600_000),
    idempotencyMaxResultBytes: r.int(
      "IDEMPOTENCY_MAX_RESULT_BYTES",
      1024 * 1024,
      1024,
      256 * 1024 * 1024,
    ),
    otlpTracesEndpoint: telemetry.otlpTracesEndpoint,
    otelServiceName: r.str("OTEL_SERVICE_NAME") ?? "model-market-gateway",
  };
  if (
    config.metricsPort !== undefined &&
    config.metricsPort !== 0 &&
    config.metricsPort === config.port
  )
    r.problems.push(
      "METRICS_PORT must differ from PORT (leave it unset to serve /metrics on PORT)",
    );
  config.probeStaleMs = r.int("PROBE_STALE_MS", config.probeIntervalMs * 2, 50, 86_400_000);
  if (r.problems.length > 0) throw new ConfigError(r.problems);
  return Object.freeze(config);
}

/** The database, the chain, the market and the operator's token. */
function connectionSettings(r: EnvReader) {
  const { problems, str, required, int } = r;
  const databaseUrl = str("DATABASE_URL");
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    problems.push("DATABASE_URL must be a postgres:// or postgresql:// URL");
  }
  const databaseDirectUrl = str("DATABASE_DIRECT_URL");
  if (databaseDirectUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseDirectUrl)) {
    problems.push("DATABASE_DIRECT_URL must be a postgres:// or postgresql:// URL");
  } else if (databaseDirectUrl !== undefined && databaseUrl === undefined) {
    problems.push("DATABASE_DIRECT_URL needs DATABASE_URL (the pooler's URL)");
  }

  const rpcUrl = required("RPC_URL", "the JSON-RPC URL of the chain the market contract lives on");
  if (rpcUrl !== "" && !/^(https?|wss?):\/\//.test(rpcUrl)) {
    problems.push("RPC_URL must be an http(s):// or ws(s):// URL");
  }
  const chainId =
    str("CHAIN_ID") === undefined ? 0 : int("CHAIN_ID", 0, 1, Number.MAX_SAFE_INTEGER);
  if (str("CHAIN_ID") === undefined)
    problems.push("CHAIN_ID is required (the chain id RPC_URL must report)");

  const market = required("MARKET_ADDRESS", "the market contract's address");
  if (market !== "" && !isAddress(market, { strict: false })) {
    problems.push(`MARKET_ADDRESS must be a 0x-prefixed 20-byte address, got "${market}"`);
  }

  const startBlockRaw = str("START_BLOCK") ?? "0";
  let startBlock = 0n;
  if (/^\d+$/.test(startBlockRaw)) startBlock = BigInt(startBlockRaw);
  else problems.push(`START_BLOCK must be a block number, got "${startBlockRaw}"`);

  const token = required(
    "SETTLEMENT_OPERATOR_TOKEN",
    "the bearer token that authorises POST /settlements/flush",
  );
  if (token !== "" && token.length < 16) {
    problems.push("SETTLEMENT_OPERATOR_TOKEN must be at least 16 characters");
  }
  return { databaseUrl, databaseDirectUrl, rpcUrl, chainId, market, startBlock, token };
}

/** The endpoints' encryption key, the settlement and receipt keys, the settlement fee caps. */
function keySettings(r: EnvReader, databaseUrl: string | undefined) {
  const { problems, str, wei } = r;
  const endpointEncryptionKey = str("ENDPOINT_ENCRYPTION_KEY");
  if (endpointEncryptionKey === undefined && databaseUrl !== undefined) {
    problems.push(
      "ENDPOINT_ENCRYPTION_KEY is required with DATABASE_URL (32 bytes as 64 hex characters or base64; every gateway sharing the database needs the same key)",
    );
  }

  const settlementPrivateKey = str("SETTLEMENT_PRIVATE_KEY");
  if (
    settlementPrivateKey !== undefined &&
    !(isHex(settlementPrivateKey, { strict: true }) && settlementPrivateKey.length === 66)
  ) {
    problems.push("SETTLEMENT_PRIVATE_KEY must be a 0x-prefixed 32-byte hex private key");
  }

  const receiptPrivateKey = str("RECEIPT_PRIVATE_KEY");
  if (receiptPrivateKey !== undefined && !isPrivateKey(receiptPrivateKey)) {
    problems.push(
      "RECEIPT_PRIVATE_KEY must be a 0x-prefixed 32-byte hex secp256k1 private key (0 < key < n)",
    );
  }

  const gwei = 1_000_000_000n;
  const maxFeePerGas = wei("SETTLEMENT_MAX_FEE_PER_GAS", 500n * gwei);
  const maxPriorityFeePerGas = wei("SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS", 50n * gwei);
  if (maxPriorityFeePerGas > maxFeePerGas) {
    problems.push(
      "SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS must not exceed SETTLEMENT_MAX_FEE_PER_GAS (the tip is part of the fee)",
    );
  }
  return {
    endpointEncryptionKey,
    settlementPrivateKey,
    receiptPrivateKey,
    maxFeePerGas,
    maxPriorityFeePerGas,
  };
}

/** The log level and where spans go. */
function telemetrySettings(r: EnvReader) {
  const { problems, str, bool } = r;
  const logLevel = (str("LOG_LEVEL") ?? "info") as LogLevel;
  if (!logLevels.includes(logLevel)) {
    problems.push(`LOG_LEVEL must be one of ${logLevels.join(", ")}`);
  }

  // Tracing: the standard OpenTelemetry variables. The URL may carry credentials: never echoed.
  const otlpUrl = (key: string): string | undefined => {
    const raw = str(key);
    if (raw !== undefined && !/^https?:\/\/[^\s]+$/.test(raw)) {
      problems.push(`${key} must be an http:// or https:// URL`);
      return undefined;
    }
    return raw;
  };
  const tracesEndpoint = otlpUrl("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  const otlpEndpoint = otlpUrl("OTEL_EXPORTER_OTLP_ENDPOINT");
  const otlpTracesEndpoint = bool("OTEL_SDK_DISABLED", false)
    ? undefined
    : (tracesEndpoint ??
      (otlpEndpoint === undefined ? undefined : `${otlpEndpoint.replace(/\/+$/, "")}/v1/traces`));
  return { logLevel, otlpTracesEndpoint };
}

/** GATEWAY_DEPLOYMENT_ID: `dep_` and 1 to 124 letters, digits, `_` or `-`; absent: undefined. */
export function readDeploymentId(r: Pick<EnvReader, "str" | "problems">): string | undefined {
  const id = r.str("GATEWAY_DEPLOYMENT_ID");
  if (id !== undefined && !deploymentIdPattern.test(id))
    r.problems.push(
      "GATEWAY_DEPLOYMENT_ID must be dep_ followed by 1 to 124 letters, digits, _ or - (GET /v1/gateway shows the database's)",
    );
  return id;
}
