import type { Hex } from "viem";
import {
  collectDefaultMetrics,
  Registry,
  type Counter,
  type Histogram,
  type LabelValues,
} from "prom-client";
import type { RpcObserver } from "../connect/call-guard.js";
import type { AuditObserver } from "../domain/audits/runner.js";
import type { AuditCorpusSource } from "../domain/audits/types.js";
import type { ChatObserver } from "../domain/chat/ports.js";
import { GatewayError, type ErrorCode } from "../domain/errors.js";
import { createSharedRefresh } from "../domain/shared-refresh.js";
import type { SettlementObserver } from "../domain/settlement/index.js";
import type { NodeRequest } from "../rest/body.js";
import { toHttpError } from "../rest/errors.js";
import type { NodeResponse } from "../rest/body.js";
import type { RestObserver } from "../rest/facade.js";
import { registerMetrics, type Metrics } from "./metric-definitions.js";

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
  /** Offers cooling down now (from memory). */
  readonly coolingDown?: () => number;
  /** Offers judged by the audits, by state (from memory). */
  readonly auditStates?: () => ReadonlyMap<string, number>;
}

export interface GatewayMetrics {
  readonly registry: Registry;
  readonly chat: ChatObserver;
  readonly settlement: SettlementObserver;
  readonly rpc: RpcObserver;
  readonly rest: RestObserver;
  /** The blind audits' requests and spend (src/domain/audits/runner.ts). */
  readonly audits: AuditObserver;
  /**
   * The authority listener (src/adapters/pg/authority-signals.ts) went up or down: while it is
   * down, changes to keys and authorizations made elsewhere apply within API_KEY_CACHE_MS.
   */
  authorityListener(up: boolean): void;
  /** The corpus the audits ask: the shipped (public) one or the operator's own. */
  auditCorpus(source: AuditCorpusSource): void;
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

/** Claim / count as a metric's number (not money: a float is fine); a count of 0 reads as 1. */
export function claimRatioOf(claimed: bigint, counted: bigint): number {
  return Number(claimed) / Number(counted > 0n ? counted : 1n);
}

const collectTimeoutMs = 1000;
/**
 * The oldest state `/ready` and `/metrics` answer from (DESIGN.md section 8): anyone may call
 * them, so a flood of them reads each source at most once per this.
 */
export const publicStateMaxAgeMs = 1000;
/** The indexer's cursor row (src/adapters/chain/indexer.ts). */
const indexerCursor = "market";

/**
 * The scrape-time figures in one round trip, each from an index: open requests and the
 * settlement queue from the unsettled requests (`inference_requests_settlement_queue`: an open
 * request is 'unsettled' too, and no index names the status, migration 031), and lease rows.
 */
const gaugeQuery = `SELECT
  (SELECT count(*) FROM inference_requests
     WHERE settlement_status = 'unsettled' AND status IN ('pending', 'streaming'))::text AS open,
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
  const m = registerMetrics(registry);
  m.authorityListenerUp.set(0);

  let sources: ScrapeSources | undefined;
  // Scrapes share one read of the sources per publicStateMaxAgeMs: the scrape is unauthenticated,
  // and a read is a database query and a chain RPC call.
  const gauges = createSharedRefresh(() => refresh(m, sources).catch(() => undefined), {
    maxAgeMs: publicStateMaxAgeMs,
  });
  const scrape = async (): Promise<string> => {
    await gauges.get();
    return registry.metrics();
  };

  return {
    registry,
    chat: chatObserver(m, options.modelName ?? ((modelId: Hex) => modelId)),
    settlement: {
      batch(status, gas) {
        m.batches.inc({ status });
        if (gas !== undefined && gas > 0n) m.gasUsed.inc(Number(gas));
      },
      failure: () => m.settlementFailures.inc(),
      insufficientFunds: () => m.insufficientFunds.inc(),
    },
    ...requestObservers(m),
    audits: auditObserver(m, options.modelName ?? ((modelId: Hex) => modelId)),
    authorityListener: (up) => m.authorityListenerUp.set(up ? 1 : 0),
    auditCorpus: (source) => m.auditCorpusPublic.set(source === "shipped" ? 1 : 0),
    setSources(s) {
      sources = s;
    },
    scrape,
    handle: (req, res) => handleScrape(req, res, registry, scrape),
  };
}

/** The chat hooks: the label children are resolved once per (model, offer). */
function chatObserver(m: Metrics, modelName: (modelId: Hex) => string): ChatObserver {
  const pairs = new Map<string, PairChildren>();
  const pair = (modelId: Hex, offerId: Hex): PairChildren => {
    const key = `${modelId}${offerId}`;
    let children = pairs.get(key);
    if (children === undefined) {
      const labels: LabelValues<"model" | "offer"> = { model: modelName(modelId), offer: offerId };
      children = {
        ttft: m.ttft.labels(labels),
        upstream: m.upstreamDuration.labels(labels),
        input: m.tokens.labels({ ...labels, type: "input" }),
        output: m.tokens.labels({ ...labels, type: "output" }),
        credits: m.credits.labels(labels),
        cached: m.cachedTokens.labels(labels),
        reasoning: m.reasoningTokens.labels(labels),
        claimInput: m.claimRatio.labels({ ...labels, kind: "input" }),
        claimOutput: m.claimRatio.labels({ ...labels, kind: "output" }),
      };
      pairs.set(key, children);
    }
    return children;
  };

  return {
    overhead: (seconds) => m.overhead.observe(seconds),
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
    cooledDown: (modelId, offerId) =>
      m.cooldowns.inc({ model: modelName(modelId), offer: offerId }),
    budgetWarned(period, crossed) {
      const labels = { period: period === "" ? "total" : period };
      m.budgetWarnings.inc(labels);
      if (crossed) m.budgetThresholdsCrossed.inc(labels);
    },
  };
}

/** The audits' hooks: labelled as the chat's are (the model's public id, the OfferID). */
function auditObserver(m: Metrics, modelName: (modelId: Hex) => string): AuditObserver {
  return {
    sent: (modelId, offerId, test) =>
      m.auditRequests.inc({ model: modelName(modelId), offer: offerId, test }),
    skipped: (modelId, test, reason) =>
      m.auditSkipped.inc({ model: modelName(modelId), test, reason }),
    spent(modelId, offerId, credits) {
      if (credits > 0n)
        m.auditCredits.inc({ model: modelName(modelId), offer: offerId }, Number(credits));
    },
  };
}

/** The hooks of the RPC and REST transports. */
function requestObservers(m: Metrics): { rpc: RpcObserver; rest: RestObserver } {
  const rejected = (code: ErrorCode, operation: string): void => {
    m.rejections.inc({ code });
    if (code === "chain_unavailable") m.chainErrors.inc({ operation });
    else if (code === "database_unavailable") m.databaseErrors.inc();
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
        count: m.requests.labels({ route, method, status }),
        duration: m.requestDuration.labels({ route, method }),
      };
      requestChildren.set(key, children);
    }
    children.count.inc();
    children.duration.observe(seconds);
  };
  return {
    rpc: {
      call: record,
      rejected: (code, procedure) => rejected(code, procedure),
    },
    rest: {
      request: (route, method, status, seconds) => record(route, method, String(status), seconds),
      rejected: (code, route) => rejected(code, route),
    },
  };
}

/** Reads the gauges' sources; a source that fails leaves its gauges out of this scrape. */
async function refresh(m: Metrics, sources: ScrapeSources | undefined): Promise<void> {
  // What could not be read is NaN (an unlabelled gauge cannot be left out), never a stale
  // or made-up value.
  const unknown = (): void => {
    for (const g of [m.openReservations, m.unsettledCredits, m.oldestUnsettled]) g.set(NaN);
    m.leases.reset();
  };
  if (sources === undefined) {
    unknown();
    m.indexerLag.set(NaN);
    return;
  }
  const s = sources;
  if (s.coolingDown !== undefined) m.offersCoolingDown.set(s.coolingDown());
  if (s.auditStates !== undefined) {
    const states = s.auditStates();
    for (const state of ["passing", "flagged", "excluded"])
      m.auditOffers.set({ state }, states.get(state) ?? 0);
  }
  const timeoutMs = s.timeoutMs ?? collectTimeoutMs;
  const [db, head] = await Promise.allSettled([
    withTimeout(s.query(gaugeQuery), timeoutMs),
    withTimeout(s.chainHead(), timeoutMs),
  ]);
  const row = db.status === "fulfilled" ? db.value.rows[0] : undefined;
  if (row === undefined) {
    m.databaseErrors.inc();
    unknown();
  } else {
    const num = (value: unknown): number | undefined =>
      value === null || value === undefined ? undefined : Number(value);
    m.openReservations.set(num(row.open) ?? 0);
    m.leases.set({ kind: "permit" }, num(row.permit_leases) ?? 0);
    m.leases.set({ kind: "offer" }, num(row.offer_leases) ?? 0);
    m.unsettledCredits.set(num(row.unsettled) ?? 0);
    const oldest = num(row.oldest);
    m.oldestUnsettled.set(oldest === undefined ? 0 : Math.max(0, s.clock() - oldest));
  }
  const cursor = row === undefined ? undefined : (row.cursor as string | null);
  if (head.status === "rejected") m.chainErrors.inc({ operation: "block_number" });
  if (head.status === "fulfilled" && cursor !== undefined && cursor !== null) {
    const lag = head.value - BigInt(s.confirmations) - BigInt(cursor);
    m.indexerLag.set(lag > 0n ? Number(lag) : 0);
  } else m.indexerLag.set(NaN);
}

/** Answers `GET /metrics` (any other method: 405). */
function handleScrape(
  req: NodeRequest,
  res: NodeResponse,
  registry: Registry,
  scrape: () => Promise<string>,
): void {
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
