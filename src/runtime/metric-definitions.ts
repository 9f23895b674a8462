import { Counter, Gauge, Histogram, type Registry } from "prom-client";

/**
 * The gateway's own metrics as one table: each definition's name, help, type, labels, buckets
 * and where its value comes from (`from`: the observer hook or the scrape-time read that sets
 * it). `registerMetrics` makes the prom-client objects from it, in the table's order (the order
 * of the exposition). Changing a name, a help text, a label or a bucket changes what dashboards
 * and alerts read: do it on purpose.
 */

/** One metric of the table. */
interface MetricDefinition {
  readonly type: "counter" | "gauge" | "histogram";
  readonly name: string;
  readonly help: string;
  readonly labelNames?: readonly string[];
  readonly buckets?: readonly number[];
  /** Where its value comes from (documentation). */
  readonly from: string;
}

/**
 * Claim / count: dense around 1 (an exact tokenizer's tolerance is a few tokens; the byte bound
 * stands well above the count), then the multiples a lying provider claims.
 */
const claimRatioBuckets = [0.5, 0.9, 0.99, 1, 1.01, 1.05, 1.1, 1.25, 1.5, 2, 5, 10, 100];

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

export const metricDefinitions = {
  requests: {
    type: "counter",
    name: "gateway_requests_total",
    help: "Requests answered, by route template (REST) or RPC procedure, method and status (HTTP status for REST; ok or the Connect code for RPCs).",
    labelNames: ["route", "method", "status"],
    from: "RpcObserver.call, RestObserver.request",
  },
  requestDuration: {
    type: "histogram",
    name: "gateway_request_duration_seconds",
    help: "Time from a request's arrival to the end of its answer (a stream: its last event).",
    labelNames: ["route", "method"],
    buckets: requestBuckets,
    from: "RpcObserver.call, RestObserver.request",
  },
  rejections: {
    type: "counter",
    name: "gateway_rejections_total",
    help: "Error answers (REST and RPC), by the error code of the body or ErrorInfo.",
    labelNames: ["code"],
    from: "RpcObserver.rejected, RestObserver.rejected",
  },
  ttft: {
    type: "histogram",
    name: "gateway_upstream_time_to_first_token_seconds",
    help: "Time from the call of the provider that answered to its first token (a JSON answer: its whole body).",
    labelNames: ["model", "offer"],
    buckets: upstreamBuckets,
    from: "ChatObserver.firstToken",
  },
  upstreamDuration: {
    type: "histogram",
    name: "gateway_upstream_request_duration_seconds",
    help: "Time from the call of the provider that answered to the end of its answer.",
    labelNames: ["model", "offer"],
    buckets: upstreamBuckets,
    from: "ChatObserver.upstreamDone",
  },
  overhead: {
    type: "histogram",
    name: "gateway_overhead_seconds",
    help: "Time the gateway spends on a chat request before calling its provider (validation, quote, permit, routing, reservation).",
    buckets: overheadBuckets,
    from: "ChatObserver.overhead",
  },
  tokens: {
    type: "counter",
    name: "gateway_tokens_total",
    help: "Tokens of closed chat requests as metered for their charge, by type (input or output).",
    labelNames: ["model", "offer", "type"],
    from: "ChatObserver.charged",
  },
  cachedTokens: {
    type: "counter",
    name: "gateway_cached_input_tokens_total",
    help: "Of the input tokens of closed chat requests, those the provider reported served from its prompt cache (not priced).",
    labelNames: ["model", "offer"],
    from: "ChatObserver.charged",
  },
  reasoningTokens: {
    type: "counter",
    name: "gateway_reasoning_tokens_total",
    help: "Of the output tokens of closed chat requests, those the provider reported spent on reasoning (not priced).",
    labelNames: ["model", "offer"],
    from: "ChatObserver.charged",
  },
  claimRatio: {
    type: "histogram",
    name: "gateway_usage_claim_ratio",
    help: "A completed answer's usage claimed by its provider divided by the gateway's own count, by kind (input or output; a count of 0 is read as 1): about 1 for an honest provider, above 1 for one that claims more than it served.",
    labelNames: ["model", "offer", "kind"],
    buckets: claimRatioBuckets,
    from: "ChatObserver.usageCompared",
  },
  credits: {
    type: "counter",
    name: "gateway_credits_charged_total",
    help: "Credits charged (credit token base units; approximate above 2^53, never use it for money).",
    labelNames: ["model", "offer"],
    from: "ChatObserver.charged",
  },
  auditRequests: {
    type: "counter",
    name: "gateway_audit_requests_total",
    help: "Blind audit requests sent (issue 39), by model, offer and test (border_probe, mmd, logprob); each paid by the operator's audit permit like any request.",
    labelNames: ["model", "offer", "test"],
    from: "AuditObserver.sent",
  },
  auditSkipped: {
    type: "counter",
    name: "gateway_audit_skipped_total",
    help: "Blind audits drawn and not sent, by model, test and reason: no_shape (no client of the model sent a framing the audit could copy: audits of it wait for clients) or over_budget (the day's audit budget could not take the audit's most).",
    labelNames: ["model", "test", "reason"],
    from: "AuditObserver.skipped",
  },
  auditCredits: {
    type: "counter",
    name: "gateway_audit_credits_spent_total",
    help: "Credits audits were charged (the operator's audit permit), by model and offer: what the daily audit budget counts (approximate above 2^53, never use it for money).",
    labelNames: ["model", "offer"],
    from: "AuditObserver.spent",
  },
  cooldowns: {
    type: "counter",
    name: "gateway_offer_cooldowns_total",
    help: "Cooldowns started by this process: an offer's provider answered 429 (or 503 with Retry-After) and the offer left routing, in every process, for the time it asked (bounded by UPSTREAM_COOLDOWN_MAX_SECONDS).",
    labelNames: ["model", "offer"],
    from: "ChatObserver.cooledDown",
  },
  budgetWarnings: {
    type: "counter",
    name: "gateway_budget_warnings_total",
    help: "Chat requests admitted at or over the soft threshold (warn_at) their payer signed on the authorization that admitted them, by the authorization's period (day, week, month, or total): each such answer carries x_gateway.budget_warning.",
    labelNames: ["period"],
    from: "ChatObserver.budgetWarned",
  },
  budgetThresholdsCrossed: {
    type: "counter",
    name: "gateway_budget_thresholds_crossed_total",
    help: "Soft thresholds crossed: the one admission per authorization and period (or ever, for a threshold on the total) that found its use at or over warn_at first, across every gateway process, by the authorization's period (day, week, month, or total).",
    labelNames: ["period"],
    from: "ChatObserver.budgetWarned",
  },
  offersCoolingDown: {
    type: "gauge",
    name: "gateway_offers_cooling_down",
    help: "Offers out of routing now because their provider asked for rest (429, or 503 with Retry-After), as this process knows them (its own and those shared by the others).",
    from: "scrape: the process's cooldowns",
  },
  auditOffers: {
    type: "gauge",
    name: "gateway_audit_offers",
    help: "Offers by what their audits say (issue 39), as this process last read the shared standings: passing, flagged (model_mismatch, routed last) or excluded (out of routing until verified again); offers never judged are not counted.",
    labelNames: ["state"],
    from: "scrape: the process's audit standings",
  },
  openReservations: {
    type: "gauge",
    name: "gateway_open_reservations",
    help: "Chat requests in flight across every gateway sharing the database (each holds a reservation, its own or in its process's lease).",
    from: "scrape: the gauge query's open",
  },
  leases: {
    type: "gauge",
    name: "gateway_leases",
    help: "Reservation leases held by gateway processes, by kind (permit credits or offer slots).",
    labelNames: ["kind"],
    from: "scrape: the gauge query's permit_leases and offer_leases",
  },
  unsettledCredits: {
    type: "gauge",
    name: "gateway_unsettled_credits",
    help: "Credits charged and not yet settled on chain, in a batch in flight included (approximate above 2^53).",
    from: "scrape: the gauge query's unsettled",
  },
  oldestUnsettled: {
    type: "gauge",
    name: "gateway_oldest_unsettled_charge_age_seconds",
    help: "Age of the oldest charge not yet settled on chain, in a batch in flight included (0 when none waits; NaN when the database could not be read).",
    from: "scrape: the gauge query's oldest, against the clock",
  },
  batches: {
    type: "counter",
    name: "gateway_settlement_batches_total",
    help: "Settlement batches as flushes report them, by status (a batch still in flight is reported again by the next flush).",
    labelNames: ["status"],
    from: "SettlementObserver.batch",
  },
  gasUsed: {
    type: "counter",
    name: "gateway_settlement_gas_used_total",
    help: "Gas used by mined settlement transactions (settled or reverted).",
    from: "SettlementObserver.batch",
  },
  settlementFailures: {
    type: "counter",
    name: "gateway_settlement_failures_total",
    help: "Flushes that failed with an error (the next flush resumes from the chain's state).",
    from: "SettlementObserver.failure",
  },
  insufficientFunds: {
    type: "counter",
    name: "gateway_settlement_insufficient_funds_total",
    help: "Settlement broadcasts the node refused because the settlement account cannot pay for gas (fund it; the same transaction is re-sent).",
    from: "SettlementObserver.insufficientFunds",
  },
  indexerLag: {
    type: "gauge",
    name: "gateway_indexer_lag_blocks",
    help: "Blocks the indexer's cursor is behind the chain head less CONFIRMATIONS (0 when caught up).",
    from: "scrape: the chain head less CONFIRMATIONS less the gauge query's cursor",
  },
  chainErrors: {
    type: "counter",
    name: "gateway_chain_errors_total",
    help: "Chain reads or writes that failed (answered chain_unavailable, or a failed scrape read), by operation.",
    labelNames: ["operation"],
    from: "rejections with code chain_unavailable; scrape: a failed chain head read",
  },
  auditCorpusPublic: {
    type: "gauge",
    name: "gateway_audit_corpus_public",
    help: "1 while the blind audits ask the shipped corpus's prompts, which anyone can read (a provider that reads them can tell audits from clients); 0 with the operator's own corpus (AUDIT_CORPUS_DIR). Absent while audits are off.",
    from: "GatewayMetrics.auditCorpus",
  },
  authorityListenerUp: {
    type: "gauge",
    name: "gateway_authority_listener_up",
    help: "1 while this process hears the database's signals of API key and permit authorization changes (LISTEN gw_authority): they apply at once; 0 while it does not (connection lost, or the embedded database): changes made by other processes then apply within API_KEY_CACHE_MS.",
    from: "GatewayMetrics.authorityListener (0 until the first call)",
  },
  databaseErrors: {
    type: "counter",
    name: "gateway_database_errors_total",
    help: "Database operations that failed (answered database_unavailable, or a failed scrape read).",
    from: "rejections with code database_unavailable; scrape: a failed gauge query",
  },
} as const satisfies Record<string, MetricDefinition>;

type Definitions = typeof metricDefinitions;
type LabelsOf<D> = D extends { readonly labelNames: readonly (infer L extends string)[] }
  ? L
  : string;
type MetricOf<D> = D extends { readonly type: "counter" }
  ? Counter<LabelsOf<D>>
  : D extends { readonly type: "gauge" }
    ? Gauge<LabelsOf<D>>
    : Histogram<LabelsOf<D>>;

/** The prom-client object of each definition, by its key in the table. */
export type Metrics = { readonly [K in keyof Definitions]: MetricOf<Definitions[K]> };

/** Makes and registers the metrics of the table, in its order. */
export function registerMetrics(registry: Registry): Metrics {
  const registers = [registry];
  const made = Object.entries(metricDefinitions).map(([key, definition]) => {
    // Only the keys a definition has: prom-client reads a present `labelNames: undefined` as set.
    const { type, from: _from, buckets, ...config } = definition as MetricDefinition;
    const labelled = { ...config, registers };
    const metric =
      type === "counter"
        ? new Counter(labelled)
        : type === "gauge"
          ? new Gauge(labelled)
          : new Histogram({ ...labelled, ...(buckets && { buckets: [...buckets] }) });
    return [key, metric] as const;
  });
  return Object.fromEntries(made) as unknown as Metrics;
}
