import type { Hex } from "viem";
import {
  collectDefaultMetrics,
  Counter,
  Gauge,
  Histogram,
  Registry,
  type LabelValues,
} from "prom-client";
import type { RpcObserver } from "../connect/interceptors.js";
import type { ChatObserver } from "../domain/chat/ports.js";
import { GatewayError, type ErrorCode } from "../domain/errors.js";
import { createSharedRefresh } from "../domain/shared-refresh.js";
import type { SettlementObserver } from "../domain/settlement/index.js";
import type { NodeRequest } from "../rest/body.js";
import { toHttpError } from "../rest/errors.js";
import type { NodeResponse, RestObserver } from "../rest/facade.js";

/**
 * Prometheus metrics of one gateway (`GET /metrics`, the text format). The domain and the
 * transports report through small observer hooks (`ChatObserver`, `SettlementObserver`,
 * `RpcObserver`, `RestObserver`) that this module implements; nothing else imports prom-client.
 * Every gateway has its own registry (tests run several in one process). No label carries a
 * caller's identity: routes are templates, RPCs procedure names, models and offers the market's
 * public ids. Credits are counted as JavaScript numbers, exact up to 2^53 and approximate above:
 * a metric is never used for money.
 */

/** Where the gauges read at scrape time come from. */
export interface ScrapeSources {
  /** Runs one query (the gateway's pool). */
  readonly query: (text: string) => Promise<{ rows: Record<string, unknown>[] }>;
  /** The chain's head block. */
  readonly chainHead: () => Promise<bigint>;
  /** Blocks the indexer stays behind the head by design (CONFIRMATIONS). */
  readonly confirmations: number;
  /** Unix seconds, the clock charges are stamped with. */
  readonly clock: () => number;
  /** The longest a scrape waits for one source; a source that fails or times out is left out. */
  readonly timeoutMs?: number;
}

export interface GatewayMetrics {
  readonly registry: Registry;
  readonly chat: ChatObserver;
  readonly settlement: SettlementObserver;
  readonly rpc: RpcObserver;
  readonly rest: RestObserver;
  /**
   * The authority listener (src/adapters/pg/authority-signals.ts) went up or down: while it is
   * down, changes to keys and authorizations made elsewhere apply within API_KEY_CACHE_MS.
   */
  authorityListener(up: boolean): void;
  /** Sets where the scrape-time gauges are read (until then they are absent). */
  setSources(sources: ScrapeSources): void;
  /**
   * The exposition text of a scrape (never fails for a source that does). Its scrape-time gauges
   * are at most `publicStateMaxAgeMs` old: concurrent scrapes share one read of the sources.
   */
  scrape(): Promise<string>;
  /** Answers `GET /metrics` (any other method: 405). */
  handle(req: NodeRequest, res: NodeResponse): void;
}

/**
 * Claim / count: dense around 1 (an exact tokenizer's tolerance is a few tokens; the byte bound
 * stands well above the count), then the multiples a lying provider claims.
 */
const claimRatioBuckets = [0.5, 0.9, 0.99, 1, 1.01, 1.05, 1.1, 1.25, 1.5, 2, 5, 10, 100];

/** Claim / count as a metric's number (not money: a float is fine); a count of 0 reads as 1. */
export function claimRatioOf(claimed: bigint, counted: bigint): number {
  return Number(claimed) / Number(counted > 0n ? counted : 1n);
}

// Seconds. Gateway overhead is milliseconds; a provider's answer may take minutes.
const overheadBuckets = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
];
const requestBuckets = [
  0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
];
const upstreamBuckets = [
  0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600,
];

const collectTimeoutMs = 1000;
/**
 * The oldest state `/ready` and `/metrics` answer from (DESIGN.md section 8): anyone may call
 * them, so a flood of them reads each source at most once per this.
 */
export const publicStateMaxAgeMs = 1000;
/** The indexer's cursor row (src/adapters/chain/indexer.ts). */
const indexerCursor = "market";

/**
 * The scrape-time figures in one round trip, each from an index: open requests
 * (`inference_requests_open`), lease rows, and the settlement queue
 * (`inference_requests_settle_queue`).
 */
const gaugeQuery = `SELECT
  (SELECT count(*) FROM inference_requests WHERE status IN ('pending', 'streaming'))::text AS open,
  (SELECT count(*) FROM permit_leases)::text AS permit_leases,
  (SELECT count(*) FROM offer_leases)::text AS offer_leases,
  ((SELECT coalesce(sum(credits_charged), 0) FROM inference_requests
     WHERE settlement_status = 'unsettled' AND credits_charged > 0)
   + (SELECT coalesce(sum(credits), 0) FROM settlement_batches
     WHERE status IN ('pending', 'submitted')))::text AS unsettled,
  LEAST(
    (SELECT min(completed_at) FROM inference_requests
      WHERE settlement_status = 'unsettled' AND credits_charged > 0),
    (SELECT min(r.completed_at) FROM settlement_batches b
      JOIN inference_requests r ON r.batch_id = b.batch_id
      WHERE b.status IN ('pending', 'submitted')))::text AS oldest,
  (SELECT block_number FROM chain_cursors WHERE name = '${indexerCursor}')::text AS cursor`;

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Labels of one (model, offer) pair, resolved once and reused. */
interface PairChildren {
  readonly ttft: ReturnType<Histogram<"model" | "offer">["labels"]>;
  readonly upstream: ReturnType<Histogram<"model" | "offer">["labels"]>;
  readonly input: ReturnType<Counter<"model" | "offer" | "type">["labels"]>;
  readonly output: ReturnType<Counter<"model" | "offer" | "type">["labels"]>;
  readonly credits: ReturnType<Counter<"model" | "offer">["labels"]>;
  readonly cached: ReturnType<Counter<"model" | "offer">["labels"]>;
  readonly reasoning: ReturnType<Counter<"model" | "offer">["labels"]>;
  readonly claimInput: ReturnType<Histogram<"model" | "offer" | "kind">["labels"]>;
  readonly claimOutput: ReturnType<Histogram<"model" | "offer" | "kind">["labels"]>;
}

/**
 * The metrics of one gateway. `modelName` turns a ModelID into the public id the catalog
 * shows (the ModelID itself when the catalog names none).
 */
export function createMetrics(
  options: { modelName?: (modelId: Hex) => string } = {},
): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "gateway_" });
  const registers = [registry];
  const modelName = options.modelName ?? ((modelId: Hex) => modelId);

  const requests = new Counter({
    name: "gateway_requests_total",
    help: "Requests answered, by route template (REST) or RPC procedure, method and status (HTTP status for REST; ok or the Connect code for RPCs).",
    labelNames: ["route", "method", "status"] as const,
    registers,
  });
  const requestDuration = new Histogram({
    name: "gateway_request_duration_seconds",
    help: "Time from a request's arrival to the end of its answer (a stream: its last event).",
    labelNames: ["route", "method"] as const,
    buckets: requestBuckets,
    registers,
  });
  const rejections = new Counter({
    name: "gateway_rejections_total",
    help: "Error answers (REST and RPC), by the error code of the body or ErrorInfo.",
    labelNames: ["code"] as const,
    registers,
  });
  const ttft = new Histogram({
    name: "gateway_upstream_time_to_first_token_seconds",
    help: "Time from the call of the provider that answered to its first token (a JSON answer: its whole body).",
    labelNames: ["model", "offer"] as const,
    buckets: upstreamBuckets,
    registers,
  });
  const upstreamDuration = new Histogram({
    name: "gateway_upstream_request_duration_seconds",
    help: "Time from the call of the provider that answered to the end of its answer.",
    labelNames: ["model", "offer"] as const,
    buckets: upstreamBuckets,
    registers,
  });
  const overhead = new Histogram({
    name: "gateway_overhead_seconds",
    help: "Time the gateway spends on a chat request before calling its provider (validation, quote, permit, routing, reservation).",
    buckets: overheadBuckets,
    registers,
  });
  const tokens = new Counter({
    name: "gateway_tokens_total",
    help: "Tokens of closed chat requests as metered for their charge, by type (input or output).",
    labelNames: ["model", "offer", "type"] as const,
    registers,
  });
  const cachedTokens = new Counter({
    name: "gateway_cached_input_tokens_total",
    help: "Of the input tokens of closed chat requests, those the provider reported served from its prompt cache (not priced).",
    labelNames: ["model", "offer"] as const,
    registers,
  });
  const reasoningTokens = new Counter({
    name: "gateway_reasoning_tokens_total",
    help: "Of the output tokens of closed chat requests, those the provider reported spent on reasoning (not priced).",
    labelNames: ["model", "offer"] as const,
    registers,
  });
  const claimRatio = new Histogram({
    name: "gateway_usage_claim_ratio",
    help: "A completed answer's usage claimed by its provider divided by the gateway's own count, by kind (input or output; a count of 0 is read as 1): about 1 for an honest provider, above 1 for one that claims more than it served.",
    labelNames: ["model", "offer", "kind"] as const,
    buckets: claimRatioBuckets,
    registers,
  });
  const credits = new Counter({
    name: "gateway_credits_charged_total",
    help: "Credits charged (credit token base units; approximate above 2^53, never use it for money).",
    labelNames: ["model", "offer"] as const,
    registers,
  });
  const openReservations = new Gauge({
    name: "gateway_open_reservations",
    help: "Chat requests in flight across every gateway sharing the database (each holds a reservation, its own or in its process's lease).",
    registers,
  });
  const leases = new Gauge({
    name: "gateway_leases",
    help: "Reservation leases held by gateway processes, by kind (permit credits or offer slots).",
    labelNames: ["kind"] as const,
    registers,
  });
  const unsettledCredits = new Gauge({
    name: "gateway_unsettled_credits",
    help: "Credits charged and not yet settled on chain, in a batch in flight included (approximate above 2^53).",
    registers,
  });
  const oldestUnsettled = new Gauge({
    name: "gateway_oldest_unsettled_charge_age_seconds",
    help: "Age of the oldest charge not yet settled on chain, in a batch in flight included (0 when none waits; NaN when the database could not be read).",
    registers,
  });
  const batches = new Counter({
    name: "gateway_settlement_batches_total",
    help: "Settlement batches as flushes report them, by status (a batch still in flight is reported again by the next flush).",
    labelNames: ["status"] as const,
    registers,
  });
  const gasUsed = new Counter({
    name: "gateway_settlement_gas_used_total",
    help: "Gas used by mined settlement transactions (settled or reverted).",
    registers,
  });
  const settlementFailures = new Counter({
    name: "gateway_settlement_failures_total",
    help: "Flushes that failed with an error (the next flush resumes from the chain's state).",
    registers,
  });
  const insufficientFunds = new Counter({
    name: "gateway_settlement_insufficient_funds_total",
    help: "Settlement broadcasts the node refused because the settlement account cannot pay for gas (fund it; the same transaction is re-sent).",
    registers,
  });
  const indexerLag = new Gauge({
    name: "gateway_indexer_lag_blocks",
    help: "Blocks the indexer's cursor is behind the chain head less CONFIRMATIONS (0 when caught up).",
    registers,
  });
  const chainErrors = new Counter({
    name: "gateway_chain_errors_total",
    help: "Chain reads or writes that failed (answered chain_unavailable, or a failed scrape read), by operation.",
    labelNames: ["operation"] as const,
    registers,
  });
  const authorityListenerUp = new Gauge({
    name: "gateway_authority_listener_up",
    help: "1 while this process hears the database's signals of API key and permit authorization changes (LISTEN gw_authority): they apply at once; 0 while it does not (connection lost, or the embedded database): changes made by other processes then apply within API_KEY_CACHE_MS.",
    registers,
  });
  authorityListenerUp.set(0);
  const databaseErrors = new Counter({
    name: "gateway_database_errors_total",
    help: "Database operations that failed (answered database_unavailable, or a failed scrape read).",
    registers,
  });

  const pairs = new Map<string, PairChildren>();
  const pair = (modelId: Hex, offerId: Hex): PairChildren => {
    const key = `${modelId}${offerId}`;
    let children = pairs.get(key);
    if (children === undefined) {
      const labels: LabelValues<"model" | "offer"> = { model: modelName(modelId), offer: offerId };
      children = {
        ttft: ttft.labels(labels),
        upstream: upstreamDuration.labels(labels),
        input: tokens.labels({ ...labels, type: "input" }),
        output: tokens.labels({ ...labels, type: "output" }),
        credits: credits.labels(labels),
        cached: cachedTokens.labels(labels),
        reasoning: reasoningTokens.labels(labels),
        claimInput: claimRatio.labels({ ...labels, kind: "input" }),
        claimOutput: claimRatio.labels({ ...labels, kind: "output" }),
      };
      pairs.set(key, children);
    }
    return children;
  };

  const rejected = (code: ErrorCode, operation: string): void => {
    rejections.inc({ code });
    if (code === "chain_unavailable") chainErrors.inc({ operation });
    else if (code === "database_unavailable") databaseErrors.inc();
  };

  const chat: ChatObserver = {
    overhead: (seconds) => overhead.observe(seconds),
    firstToken: (modelId, offerId, seconds) => pair(modelId, offerId).ttft.observe(seconds),
    upstreamDone: (modelId, offerId, seconds) => pair(modelId, offerId).upstream.observe(seconds),
    charged(modelId, offerId, inputTokens, outputTokens, charge, details) {
      const children = pair(modelId, offerId);
      if (inputTokens > 0n) children.input.inc(Number(inputTokens));
      if (outputTokens > 0n) children.output.inc(Number(outputTokens));
      if (charge > 0n) children.credits.inc(Number(charge));
      if (details.cachedInputTokens > 0n) children.cached.inc(Number(details.cachedInputTokens));
      if (details.reasoningTokens > 0n) children.reasoning.inc(Number(details.reasoningTokens));
    },
    usageCompared(modelId, offerId, claimed, counted) {
      const children = pair(modelId, offerId);
      children.claimInput.observe(claimRatioOf(claimed.inputTokens, counted.inputTokens));
      children.claimOutput.observe(claimRatioOf(claimed.outputTokens, counted.outputTokens));
    },
  };

  const settlement: SettlementObserver = {
    batch(status, gas) {
      batches.inc({ status });
      if (gas !== undefined && gas > 0n) gasUsed.inc(Number(gas));
    },
    failure: () => settlementFailures.inc(),
    insufficientFunds: () => insufficientFunds.inc(),
  };

  // Per request: the label children are resolved once per (route, method, status), as `pair`
  // does for (model, offer), not hashed from a label object on every answer.
  const requestChildren = new Map<
    string,
    {
      readonly count: ReturnType<Counter<"route" | "method" | "status">["labels"]>;
      readonly duration: ReturnType<Histogram<"route" | "method">["labels"]>;
    }
  >();
  const record = (route: string, method: string, status: string, seconds: number): void => {
    const key = `${method} ${status} ${route}`;
    let children = requestChildren.get(key);
    if (children === undefined) {
      children = {
        count: requests.labels({ route, method, status }),
        duration: requestDuration.labels({ route, method }),
      };
      requestChildren.set(key, children);
    }
    children.count.inc();
    children.duration.observe(seconds);
  };
  const rpc: RpcObserver = {
    call: record,
    rejected: (code, procedure) => rejected(code, procedure),
  };
  const rest: RestObserver = {
    request: (route, method, status, seconds) => record(route, method, String(status), seconds),
    rejected: (code, route) => rejected(code, route),
  };

  let sources: ScrapeSources | undefined;

  /** Reads the gauges' sources; a source that fails leaves its gauges out of this scrape. */
  async function refresh(): Promise<void> {
    // What could not be read is NaN (an unlabelled gauge cannot be left out), never a stale
    // or made-up value.
    const unknown = (): void => {
      for (const g of [openReservations, unsettledCredits, oldestUnsettled]) g.set(NaN);
      leases.reset();
    };
    if (sources === undefined) {
      unknown();
      indexerLag.set(NaN);
      return;
    }
    const s = sources;
    const timeoutMs = s.timeoutMs ?? collectTimeoutMs;
    const [db, head] = await Promise.allSettled([
      withTimeout(s.query(gaugeQuery), timeoutMs),
      withTimeout(s.chainHead(), timeoutMs),
    ]);
    const row = db.status === "fulfilled" ? db.value.rows[0] : undefined;
    if (row === undefined) {
      databaseErrors.inc();
      unknown();
    } else {
      const num = (value: unknown): number | undefined =>
        value === null || value === undefined ? undefined : Number(value);
      openReservations.set(num(row.open) ?? 0);
      leases.set({ kind: "permit" }, num(row.permit_leases) ?? 0);
      leases.set({ kind: "offer" }, num(row.offer_leases) ?? 0);
      unsettledCredits.set(num(row.unsettled) ?? 0);
      const oldest = num(row.oldest);
      oldestUnsettled.set(oldest === undefined ? 0 : Math.max(0, s.clock() - oldest));
    }
    const cursor = row === undefined ? undefined : (row.cursor as string | null);
    if (head.status === "rejected") chainErrors.inc({ operation: "block_number" });
    if (head.status === "fulfilled" && cursor !== undefined && cursor !== null) {
      const lag = head.value - BigInt(s.confirmations) - BigInt(cursor);
      indexerLag.set(lag > 0n ? Number(lag) : 0);
    } else indexerLag.set(NaN);
  }

  // Scrapes share one read of the sources per publicStateMaxAgeMs: the scrape is unauthenticated,
  // and a read is a database query and a chain RPC call.
  const gauges = createSharedRefresh(() => refresh().catch(() => undefined), {
    maxAgeMs: publicStateMaxAgeMs,
  });
  const scrape = async (): Promise<string> => {
    await gauges.get();
    return registry.metrics();
  };

  return {
    registry,
    chat,
    settlement,
    rpc,
    rest,
    authorityListener: (up) => authorityListenerUp.set(up ? 1 : 0),
    setSources(s) {
      sources = s;
    },
    scrape,
    handle(req, res) {
      req.resume();
      if (req.method !== "GET" && req.method !== "HEAD") {
        sendError(
          res,
          new GatewayError("method_not_allowed", `${req.method} is not allowed on /metrics`),
        );
        return;
      }
      scrape().then(
        (text) => {
          res.writeHead(200, {
            "content-type": registry.contentType,
            "content-length": Buffer.byteLength(text),
          });
          if (req.method === "HEAD") res.end();
          else res.end(text);
        },
        () => {
          res.writeHead(500, { "content-type": "text/plain" });
          res.end("metrics unavailable\n");
        },
      );
    },
  };
}

function sendError(res: NodeResponse, error: GatewayError): void {
  const { status, body } = toHttpError(error);
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
  });
  res.end(payload);
}

/**
 * The handler of the metrics listener (METRICS_PORT): `/metrics` and nothing else (404
 * `route_not_found`), no credentials.
 */
export function metricsOnlyHandler(
  metrics: GatewayMetrics,
): (req: NodeRequest, res: NodeResponse) => void {
  return (req, res) => {
    if (isMetricsPath(req.url)) {
      metrics.handle(req, res);
      return;
    }
    req.resume();
    sendError(res, new GatewayError("route_not_found", "only /metrics is served on this port"));
  };
}

/** Whether a request target is `/metrics` (a query string is ignored). */
export function isMetricsPath(url: string | undefined): boolean {
  return url === "/metrics" || url?.startsWith("/metrics?") === true;
}
