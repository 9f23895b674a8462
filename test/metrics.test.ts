import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CatalogService } from "../gen/gateway/v1/catalog_pb.js";
import { ConfigError, parseConfig } from "../src/config.js";
import { createMetrics, publicStateMaxAgeMs } from "../src/runtime/metrics.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { flush, settlingEnv } from "./helpers/settlement.js";
import { authed, json, startChatStack, startTestStack, type TestStack } from "./helpers/stack.js";

/** One sample of the Prometheus text format. */
interface Sample {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly value: number;
}

/**
 * Parses the Prometheus text exposition format (0.0.4): comments skipped, label values
 * unescaped (`\\`, `\"`, `\n`), values as numbers (`+Inf`, `NaN` included).
 */
function parseMetrics(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const name = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line)?.[0];
    if (name === undefined) throw new Error(`unparsable line: ${line}`);
    let rest = line.slice(name.length);
    const labels: Record<string, string> = {};
    if (rest.startsWith("{")) {
      rest = rest.slice(1);
      while (!rest.startsWith("}")) {
        const m = /^([a-zA-Z_][a-zA-Z0-9_]*)="/.exec(rest);
        if (m === null) throw new Error(`unparsable labels: ${line}`);
        rest = rest.slice(m[0].length);
        let value = "";
        for (;;) {
          const c = rest[0];
          if (c === undefined) throw new Error(`unterminated label value: ${line}`);
          rest = rest.slice(1);
          if (c === '"') break;
          if (c === "\\") {
            const e = rest[0];
            rest = rest.slice(1);
            value += e === "n" ? "\n" : (e ?? "");
          } else value += c;
        }
        labels[m[1]!] = value;
        if (rest.startsWith(",")) rest = rest.slice(1);
      }
      rest = rest.slice(1);
    }
    // Prometheus reads NaN and Inf in any case (prom-client writes `Nan`).
    const [valueText] = rest.trim().split(/\s+/);
    const word = valueText?.toLowerCase();
    const value =
      word === "+inf" || word === "inf"
        ? Infinity
        : word === "-inf"
          ? -Infinity
          : Number(valueText);
    if (valueText === undefined || (Number.isNaN(value) && word !== "nan"))
      throw new Error(`unparsable value: ${line}`);
    samples.push({ name, labels, value });
  }
  return samples;
}

/** The samples named `name` whose labels include `labels`. */
function find(samples: Sample[], name: string, labels: Record<string, string> = {}): Sample[] {
  return samples.filter(
    (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
  );
}

/** The sum of the matching samples' values (0 when none). */
function total(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  return find(samples, name, labels).reduce((sum, s) => sum + s.value, 0);
}

async function scrape(url: string): Promise<{ res: Response; samples: Sample[]; text: string }> {
  const res = await fetch(url);
  const text = await res.text();
  return { res, text, samples: res.status === 200 ? parseMetrics(text) : [] };
}

/**
 * Scrapes until `ready` holds: the scrape-time gauges are read at most once per
 * publicStateMaxAgeMs (1 s), so a change shows within about a second, not on the next scrape.
 */
async function scrapeUntil(
  url: string,
  ready: (samples: Sample[]) => boolean,
): Promise<{ res: Response; samples: Sample[]; text: string }> {
  const deadline = Date.now() + publicStateMaxAgeMs + 2_000;
  for (;;) {
    const scraped = await scrape(url);
    if (ready(scraped.samples) || Date.now() > deadline) return scraped;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("Prometheus metrics on the main port", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chat = (body: object, headers: Record<string, string> = {}) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        ...headers,
      },
      body: JSON.stringify(body),
    });

  it("counts requests, rejections, tokens, credits, time to first token and overhead, with no caller identity in any label", async () => {
    const messages = [{ role: "user", content: "count me" }];
    const plain = await chat({ model: "demo-chat", messages, max_tokens: 16 });
    expect(plain.status).toBe(200);
    const requestId = plain.headers.get("x-gateway-request-id")!;
    await plain.text();
    const streamed = await chat({ model: "demo-chat", messages, max_tokens: 16, stream: true });
    expect(streamed.status).toBe(200);
    expect(await streamed.text()).toContain("data: [DONE]");
    // Rejections with known codes: no permit (402), an unknown model (404), a bad route (404).
    const refused = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
    expect(refused.status).toBe(402);
    expect((await json(refused)).error.code).toBe("permit_missing");
    const unknown = await authed(stack, `/v1/models/no-such-model-${requestId}`);
    expect(unknown.status).toBe(404);
    expect((await authed(stack, `/v1/requests/${requestId}`)).status).toBe(200);
    expect((await authed(stack, `/v1/nowhere/${requestId}`)).status).toBe(404);
    // A network RPC (gRPC), counted under its procedure.
    const client = grpcClient(stack.gateway.url);
    try {
      await grpcUnary(
        client,
        CatalogService.method.listModels,
        {},
        {
          authorization: `Bearer ${stack.apiKey}`,
        },
      );
    } finally {
      client.close();
    }

    // No credentials needed, served before the facade.
    expect(stack.gateway.metricsUrl).toBe(`${stack.gateway.url}/metrics`);
    const { res, samples, text } = await scrape(stack.gateway.metricsUrl);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);

    const chatRoute = { route: "/v1/chat/completions", method: "POST" };
    expect(total(samples, "gateway_requests_total", { ...chatRoute, status: "200" })).toBe(2);
    expect(total(samples, "gateway_requests_total", { ...chatRoute, status: "402" })).toBe(1);
    expect(
      total(samples, "gateway_requests_total", { route: "/v1/models/{id}", status: "404" }),
    ).toBe(1);
    expect(
      total(samples, "gateway_requests_total", { route: "/v1/requests/{id}", status: "200" }),
    ).toBeGreaterThanOrEqual(1);
    expect(
      total(samples, "gateway_requests_total", { route: "unmatched", status: "404" }),
    ).toBeGreaterThanOrEqual(1);
    expect(
      total(samples, "gateway_requests_total", {
        route: "gateway.v1.CatalogService/ListModels",
        method: "POST",
        status: "ok",
      }),
    ).toBe(1);
    expect(
      total(samples, "gateway_request_duration_seconds_count", chatRoute),
    ).toBeGreaterThanOrEqual(3);

    expect(total(samples, "gateway_rejections_total", { code: "permit_missing" })).toBe(1);
    expect(total(samples, "gateway_rejections_total", { code: "model_not_found" })).toBe(1);
    expect(total(samples, "gateway_rejections_total", { code: "route_not_found" })).toBe(1);

    // The chat metrics, labelled with the catalog's public model id and the offer.
    const pair = { model: "demo-chat" };
    expect(total(samples, "gateway_tokens_total", { ...pair, type: "input" })).toBeGreaterThan(0);
    expect(total(samples, "gateway_tokens_total", { ...pair, type: "output" })).toBeGreaterThan(0);
    const credits = total(samples, "gateway_credits_charged_total", pair);
    expect(credits).toBeGreaterThan(0);
    const recorded = await stack.database.db.pool.query<{ sum: string }>(
      "SELECT coalesce(sum(credits_charged), 0)::text AS sum FROM inference_requests",
    );
    expect(credits).toBe(Number(recorded.rows[0]!.sum));
    for (const histogram of [
      "gateway_upstream_time_to_first_token_seconds",
      "gateway_upstream_request_duration_seconds",
    ]) {
      expect(total(samples, `${histogram}_count`, pair)).toBe(2);
      expect(total(samples, `${histogram}_sum`, pair)).toBeGreaterThan(0);
    }
    expect(total(samples, "gateway_overhead_seconds_count")).toBe(2);
    expect(total(samples, "gateway_overhead_seconds_sum")).toBeGreaterThan(0);

    // Gauges read at scrape time, and the default process metrics.
    expect(find(samples, "gateway_open_reservations")).toHaveLength(1);
    expect(find(samples, "gateway_leases", { kind: "permit" })).toHaveLength(1);
    expect(find(samples, "gateway_leases", { kind: "offer" })).toHaveLength(1);
    expect(total(samples, "gateway_unsettled_credits")).toBe(credits);
    expect(find(samples, "gateway_oldest_unsettled_charge_age_seconds")).toHaveLength(1);
    expect(find(samples, "gateway_indexer_lag_blocks")).toHaveLength(1);
    expect(total(samples, "gateway_indexer_lag_blocks")).toBeGreaterThanOrEqual(0);
    expect(find(samples, "gateway_process_cpu_user_seconds_total")).toHaveLength(1);
    // The authority listener: up on PostgreSQL; the embedded PGlite serves one connection to
    // one process, which has no listener (its own changes apply at once): 0.
    expect(total(samples, "gateway_authority_listener_up")).toBe(
      stack.database.db.kind === "postgres" ? 1 : 0,
    );

    // No caller identity and no raw path anywhere: not the key, the permit, a request id, or
    // a path with an id in it.
    expect(text).not.toContain(stack.apiKey);
    expect(text).not.toContain(stack.demo.permitId);
    expect(text.toLowerCase()).not.toContain(requestId.toLowerCase());
    for (const s of samples) {
      for (const value of Object.values(s.labels)) {
        if (value.startsWith("/")) expect(value).not.toMatch(/0x|no-such-model|nowhere/);
      }
      expect(Object.keys(s.labels)).not.toContain("api_key");
    }
  });

  it("counts settlement batches and the gas they used", async () => {
    const res = await chat({
      model: "demo-chat",
      messages: [{ role: "user", content: "settle me" }],
      max_tokens: 8,
    });
    expect(res.status).toBe(200);
    await res.text();
    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    expect(flushed.body.batches.map((b: { status: string }) => b.status)).toContain("settled");
    const { samples } = await scrapeUntil(
      stack.gateway.metricsUrl,
      (s) => total(s, "gateway_unsettled_credits") === 0,
    );
    expect(total(samples, "gateway_settlement_batches_total", { status: "settled" })).toBe(
      flushed.body.batches.filter((b: { status: string }) => b.status === "settled").length,
    );
    expect(total(samples, "gateway_settlement_gas_used_total")).toBeGreaterThan(0);
    expect(find(samples, "gateway_settlement_failures_total")).toHaveLength(1);
    expect(find(samples, "gateway_settlement_insufficient_funds_total")).toEqual([
      expect.objectContaining({ value: 0 }),
    ]);
    expect(total(samples, "gateway_unsettled_credits")).toBe(0);
    expect(total(samples, "gateway_oldest_unsettled_charge_age_seconds")).toBe(0);
  });

  it("counts a charge in a batch still in flight as unsettled, with its age", async () => {
    const res = await chat({
      model: "demo-chat",
      messages: [{ role: "user", content: "settle me later" }],
      max_tokens: 8,
    });
    expect(res.status).toBe(200);
    const requestId = res.headers.get("x-gateway-request-id")!;
    await res.text();
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    const charged = BigInt(record.credits_charged);
    expect(charged).toBeGreaterThan(0n);
    // As a flush leaves it when its broadcast keeps failing: the batch stored, its charges
    // `settling` (written here directly, so no chain is involved).
    const pool = stack.database.db.pool;
    const batchId = `0x${"ab".repeat(32)}`;
    await pool.query(
      `INSERT INTO settlement_batches (batch_id, account, status, charges, calldata, requests,
         credits, created_at)
       VALUES ($1, 'test', 'submitted', '[]', '0x', 1, $2, 0)`,
      [batchId, charged.toString()],
    );
    await pool.query(
      "UPDATE inference_requests SET settlement_status = 'settling', batch_id = $1 WHERE id = $2",
      [batchId, requestId],
    );
    try {
      const { samples } = await scrapeUntil(
        stack.gateway.metricsUrl,
        (s) => total(s, "gateway_unsettled_credits") === Number(charged),
      );
      expect(total(samples, "gateway_unsettled_credits")).toBe(Number(charged));
      expect(total(samples, "gateway_oldest_unsettled_charge_age_seconds")).toBeGreaterThanOrEqual(
        0,
      );
      expect(find(samples, "gateway_oldest_unsettled_charge_age_seconds")).toHaveLength(1);
    } finally {
      await pool.query(
        "UPDATE inference_requests SET settlement_status = 'unsettled', batch_id = NULL WHERE id = $1",
        [requestId],
      );
      await pool.query("DELETE FROM settlement_batches WHERE batch_id = $1", [batchId]);
    }
  });

  it("answers other methods on /metrics with the error body", async () => {
    const res = await fetch(stack.gateway.metricsUrl, { method: "POST", body: "{}" });
    expect(res.status).toBe(405);
    expect((await json(res)).error.code).toBe("method_not_allowed");
  });
});

describe("Prometheus metrics on METRICS_PORT", () => {
  let stack: TestStack;

  beforeAll(async () => {
    stack = await startTestStack({ METRICS_PORT: "0" });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it("serves /metrics only on its own listener, and the main port no longer does", async () => {
    expect(stack.gateway.metricsUrl).not.toBe(`${stack.gateway.url}/metrics`);
    const { res, samples } = await scrape(stack.gateway.metricsUrl);
    expect(res.status).toBe(200);
    expect(find(samples, "gateway_process_cpu_user_seconds_total")).toHaveLength(1);

    const main = await fetch(`${stack.gateway.url}/metrics`);
    expect(main.status).toBe(404);
    expect((await json(main)).error.code).toBe("route_not_found");

    // The metrics listener serves nothing else.
    const other = await fetch(new URL("/v1/models", stack.gateway.metricsUrl));
    expect(other.status).toBe(404);
    expect((await json(other)).error.code).toBe("route_not_found");
    // ... and the main port's requests are still counted there.
    const { samples: after } = await scrape(stack.gateway.metricsUrl);
    expect(
      total(after, "gateway_rejections_total", { code: "route_not_found" }),
    ).toBeGreaterThanOrEqual(1);
  });
});

describe("scrape-time gauges", () => {
  it("show NaN for what they cannot read, within their timeout, without failing the scrape", async () => {
    const metrics = createMetrics();
    metrics.setSources({
      query: () => Promise.reject(new Error("database down")),
      chainHead: () => new Promise<bigint>(() => {}), // never answers
      confirmations: 0,
      clock: () => 0,
      timeoutMs: 50,
    });
    const samples = parseMetrics(await metrics.scrape());
    for (const name of [
      "gateway_open_reservations",
      "gateway_unsettled_credits",
      "gateway_oldest_unsettled_charge_age_seconds",
      "gateway_indexer_lag_blocks",
    ]) {
      expect(find(samples, name).map((s) => s.value)).toEqual([NaN]);
    }
    expect(find(samples, "gateway_leases")).toHaveLength(0);
    expect(total(samples, "gateway_database_errors_total")).toBe(1);
    expect(total(samples, "gateway_chain_errors_total", { operation: "block_number" })).toBe(1);
    expect(find(samples, "gateway_process_cpu_user_seconds_total")).toHaveLength(1);
  });

  it("count chain and database errors by the codes they are answered with", () => {
    const metrics = createMetrics();
    metrics.rpc.rejected("chain_unavailable", "gateway.v1.InferenceService/GetPermit");
    metrics.rest.rejected("database_unavailable", "/v1/chat/completions");
    return metrics.scrape().then((text) => {
      const samples = parseMetrics(text);
      expect(
        total(samples, "gateway_chain_errors_total", {
          operation: "gateway.v1.InferenceService/GetPermit",
        }),
      ).toBe(1);
      expect(total(samples, "gateway_database_errors_total")).toBe(1);
      expect(total(samples, "gateway_rejections_total", { code: "chain_unavailable" })).toBe(1);
    });
  });
});

describe("METRICS_PORT configuration", () => {
  const base = {
    RPC_URL: "http://127.0.0.1:8545",
    CHAIN_ID: "31337",
    MARKET_ADDRESS: `0x${"ab".repeat(20)}`,
    SETTLEMENT_OPERATOR_TOKEN: "x".repeat(16),
  };
  it("defaults to the main port and refuses a bad or clashing port", () => {
    expect(parseConfig(base).metricsPort).toBeUndefined();
    expect(parseConfig({ ...base, METRICS_PORT: "9464" }).metricsPort).toBe(9464);
    expect(() => parseConfig({ ...base, METRICS_PORT: "http" })).toThrow(ConfigError);
    expect(() => parseConfig({ ...base, METRICS_PORT: "70000" })).toThrow(ConfigError);
    expect(() => parseConfig({ ...base, PORT: "9000", METRICS_PORT: "9000" })).toThrow(
      /METRICS_PORT must differ from PORT/,
    );
  });
});
