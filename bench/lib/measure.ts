import http from "node:http";
import autocannon from "autocannon";
import { SLOW_STREAM_USER, STREAM_CONTENT_CHUNKS } from "../child.js";

/**
 * The three kinds of measurement: a preflight (one request, its answer checked in full), the
 * unloaded latency (sequential requests on one keep-alive connection, timed here with
 * `process.hrtime`), and the load (autocannon, a fixed number of connections for a fixed time).
 */

export type Scenario = "json" | "sse";
export const scenarios: readonly Scenario[] = ["json", "sse"];

export interface Target {
  readonly name: "gateway" | "proxy";
  readonly url: string;
  readonly headers: Readonly<Record<string, string>>;
}

export const chatPath = "/v1/chat/completions";

/**
 * The output limit of every bench request: room for the fake upstream's 20 stream chunks
 * (" tok19" is three tokens for the demo model's tokenizer), which the gateway would otherwise
 * cut at the limit (issue 27: the relay ends an answer at its priced limit). It was 16 before
 * the gateway counted tokens itself.
 */
export const benchMaxTokens = 64;

export function requestBody(scenario: Scenario): string {
  return JSON.stringify({
    model: "demo-chat",
    messages: [{ role: "user", content: "hi" }],
    max_tokens: benchMaxTokens,
    ...(scenario === "sse" ? { stream: true } : {}),
  });
}

/** The dialect routes (issue 20), measured on the gateway alone (the proxy speaks chat only). */
export type DialectRoute = "responses" | "messages";
export const dialectRoutes: readonly DialectRoute[] = ["responses", "messages"];

/** The same request as `requestBody`, in a dialect: its path and body. */
export function dialectRequest(
  dialect: DialectRoute,
  scenario: Scenario,
): { path: string; body: string } {
  const stream = scenario === "sse" ? { stream: true } : {};
  return dialect === "responses"
    ? {
        path: "/v1/responses",
        body: JSON.stringify({
          model: "demo-chat",
          input: "hi",
          max_output_tokens: benchMaxTokens,
          ...stream,
        }),
      }
    : {
        path: "/v1/messages",
        body: JSON.stringify({
          model: "demo-chat",
          max_tokens: benchMaxTokens,
          messages: [{ role: "user", content: "hi" }],
          ...stream,
        }),
      };
}

/**
 * The unary phase's request (issue 36): `POST /v1/quotes` with the chat JSON body, a keyed REST
 * route through the API-key guard and the QuoteService, no upstream call: what the guard and the
 * REST-to-service seam cost per call, beside the chat phases.
 */
export function unaryRequest(): { path: string; body: string } {
  return { path: "/v1/quotes", body: requestBody("json") };
}

/**
 * A streaming request the fake upstream answers slowly (its chunks spread over
 * `SLOW_STREAM_MS`): selected by `"user"`, which the gateway forwards unchanged (it only splices
 * `stream_options.include_usage` into a streaming body) and the proxy pipes as it is.
 */
export function slowStreamBody(): string {
  return JSON.stringify({
    model: "demo-chat",
    messages: [{ role: "user", content: "hi" }],
    max_tokens: benchMaxTokens,
    stream: true,
    user: SLOW_STREAM_USER,
  });
}

// ------------------------------------------------------------------ one timed request

interface TimedAnswer {
  readonly status: number;
  readonly contentType: string;
  /** ms from the request's start to the response headers, first body byte, last body byte. */
  readonly headersMs: number;
  readonly firstByteMs: number;
  readonly totalMs: number;
  readonly body: string;
}

const requestTimeoutMs = 10_000;
const keptBodyBytes = 64 * 1024;

function timedRequest(
  agent: http.Agent,
  target: Target,
  body: string,
  keepBody: boolean,
): Promise<TimedAnswer> {
  return new Promise<TimedAnswer>((resolve, reject) => {
    const url = new URL(chatPath, target.url);
    const start = process.hrtime.bigint();
    const ms = (): number => Number(process.hrtime.bigint() - start) / 1e6;
    const req = http.request(url, {
      method: "POST",
      agent,
      headers: { ...target.headers, "content-length": Buffer.byteLength(body) },
      timeout: requestTimeoutMs,
    });
    req.on("timeout", () => req.destroy(new Error(`no answer within ${requestTimeoutMs} ms`)));
    req.on("error", reject);
    req.on("response", (res) => {
      const headersMs = ms();
      let firstByteMs: number | undefined;
      const kept: Buffer[] = [];
      let keptBytes = 0;
      res.on("data", (chunk: Buffer) => {
        firstByteMs ??= ms();
        if (keepBody && keptBytes < keptBodyBytes) {
          kept.push(chunk);
          keptBytes += chunk.length;
        }
      });
      res.on("error", reject);
      res.on("end", () => {
        const totalMs = ms();
        resolve({
          status: res.statusCode ?? 0,
          contentType: String(res.headers["content-type"] ?? ""),
          headersMs,
          firstByteMs: firstByteMs ?? totalMs,
          totalMs,
          body: Buffer.concat(kept).toString("utf8"),
        });
      });
    });
    req.end(body);
  });
}

// ------------------------------------------------------------------ preflight

export interface Preflight {
  readonly ok: boolean;
  readonly status: number;
  /** What was wrong, or what was seen when right. */
  readonly detail: string;
  /** The `error.code` of an error body, when there was one. */
  readonly errorCode?: string;
}

/** The error code and message of an OpenAI/gateway error body, if `text` is one. */
export function describeErrorBody(text: string): { code?: string; message: string } {
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    const code = typeof parsed.error?.code === "string" ? parsed.error.code : undefined;
    const message = typeof parsed.error?.message === "string" ? parsed.error.message : text;
    return { ...(code === undefined ? {} : { code }), message: message.slice(0, 200) };
  } catch {
    return { message: text.slice(0, 200) };
  }
}

/**
 * One request, its answer checked in full: 200; JSON: a `chat.completion` with choices and
 * usage; SSE: `text/event-stream`, 20 content chunks, ending with `data: [DONE]`.
 */
export async function preflight(target: Target, scenario: Scenario): Promise<Preflight> {
  const agent = new http.Agent({ keepAlive: false });
  let answer: TimedAnswer;
  try {
    answer = await timedRequest(agent, target, requestBody(scenario), true);
  } catch (error) {
    return { ok: false, status: 0, detail: `request failed: ${(error as Error).message}` };
  } finally {
    agent.destroy();
  }
  if (answer.status < 200 || answer.status > 299) {
    const { code, message } = describeErrorBody(answer.body);
    return {
      ok: false,
      status: answer.status,
      detail: `HTTP ${answer.status}${code === undefined ? "" : ` ${code}`}: ${message}`,
      ...(code === undefined ? {} : { errorCode: code }),
    };
  }
  if (scenario === "json") {
    try {
      const parsed = JSON.parse(answer.body) as {
        object?: unknown;
        choices?: unknown;
        usage?: unknown;
      };
      if (parsed.object !== "chat.completion" || !Array.isArray(parsed.choices)) {
        return { ok: false, status: answer.status, detail: "not a chat.completion object" };
      }
      return {
        ok: true,
        status: answer.status,
        detail: `chat.completion${parsed.usage ? " with usage" : " without usage"}`,
      };
    } catch {
      return { ok: false, status: answer.status, detail: "the body is not JSON" };
    }
  }
  if (!answer.contentType.startsWith("text/event-stream")) {
    return {
      ok: false,
      status: answer.status,
      detail: `content-type is "${answer.contentType}", not text/event-stream`,
    };
  }
  const problem = checkStream(answer.body);
  if (typeof problem === "string") return { ok: false, status: answer.status, detail: problem };
  return { ok: true, status: answer.status, detail: `${problem.events} events ending with [DONE]` };
}

/**
 * Checks a complete SSE body: it ends with `data: [DONE]` and has exactly 20 content chunks.
 * Returns what is wrong, or the number of events.
 */
export function checkStream(body: string): string | { events: number } {
  const events = body
    .split(/\r?\n\r?\n/)
    .map((e) => e.trim())
    .filter((e) => e.startsWith("data:"))
    .map((e) => e.slice("data:".length).trim());
  if (events.at(-1) !== "[DONE]") return "the stream does not end with [DONE]";
  let content = 0;
  for (const data of events.slice(0, -1)) {
    try {
      const chunk = JSON.parse(data) as { choices?: { delta?: { content?: unknown } }[] };
      if (typeof chunk.choices?.[0]?.delta?.content === "string") content++;
    } catch {
      return "an SSE event is not JSON";
    }
  }
  if (content !== STREAM_CONTENT_CHUNKS) {
    return `${content} content chunks, expected ${STREAM_CONTENT_CHUNKS}`;
  }
  return { events: events.length };
}

// ------------------------------------------------------------------ unloaded latency

export interface Percentiles {
  readonly count: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly min: number;
  readonly max: number;
  readonly mean: number;
}

/** Nearest-rank percentiles of `values` (ms). */
export function percentiles(values: readonly number[]): Percentiles | undefined {
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number): number =>
    sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
  return {
    count: sorted.length,
    p50: at(0.5),
    p90: at(0.9),
    p99: at(0.99),
    min: sorted[0]!,
    max: sorted[sorted.length - 1]!,
    mean: sorted.reduce((a, b) => a + b, 0) / sorted.length,
  };
}

/** Sequential samples of one target and scenario on one keep-alive connection. */
export class UnloadedSampler {
  readonly total: number[] = [];
  readonly firstByte: number[] = [];
  readonly headers: number[] = [];
  readonly statuses = new Map<number, number>();
  readonly failures: string[] = [];
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  private readonly body: string;

  constructor(
    readonly target: Target,
    readonly scenario: Scenario,
  ) {
    this.body = requestBody(scenario);
  }

  /**
   * Runs `count` requests one after another (fewer if `deadline`, a `Date.now()` value, passes
   * first); records them unless `warmup`.
   */
  async run(count: number, warmup = false, deadline = Infinity): Promise<void> {
    for (let i = 0; i < count && Date.now() < deadline; i++) {
      let answer: TimedAnswer;
      try {
        answer = await timedRequest(this.agent, this.target, this.body, false);
      } catch (error) {
        if (!warmup) this.failures.push((error as Error).message);
        continue;
      }
      if (warmup) continue;
      this.statuses.set(answer.status, (this.statuses.get(answer.status) ?? 0) + 1);
      if (answer.status < 200 || answer.status > 299) continue;
      this.total.push(answer.totalMs);
      this.firstByte.push(answer.firstByteMs);
      this.headers.push(answer.headersMs);
    }
  }

  close(): void {
    this.agent.destroy();
  }
}

// ------------------------------------------------------------------ load

export interface LoadResult {
  readonly connections: number;
  readonly seconds: number;
  /** Successful (2xx) responses per second: the throughput figure. */
  readonly requestsPerSecond: number;
  readonly responses: number;
  readonly ok: number;
  readonly non2xx: number;
  /** Connection errors and timeouts. */
  readonly errors: number;
  readonly timeouts: number;
  readonly statusCodes: Record<string, number>;
  /** Latency of the 2xx responses, request written to response complete, ms (autocannon). */
  readonly latencyMs: { p50: number; p90: number; p99: number; mean: number; max: number };
  /** Up to three bodies of each non-2xx status seen, as `HTTP nnn code: message`. */
  readonly errorSamples: string[];
}

export async function load(
  target: Target,
  scenario: Scenario,
  opts: {
    connections: number;
    seconds: number;
    /** Called on every response as it completes (autocannon's `response` event). */
    onResponse?: (status: number) => void;
    /**
     * Another route and body than the chat request's (a dialect route); a function body is
     * called for every request (a body that varies, as an agent's next turn does).
     */
    request?: { path: string; body: string | (() => string) };
  },
): Promise<LoadResult> {
  const samples = new Map<number, string[]>();
  const options: autocannon.Options = {
    url: target.url,
    connections: opts.connections,
    duration: opts.seconds,
    pipelining: 1,
    timeout: 10,
    requests: [
      {
        method: "POST",
        path: opts.request?.path ?? chatPath,
        headers: { ...target.headers },
        ...(typeof opts.request?.body === "function"
          ? {
              setupRequest: ((body: () => string) => (request: autocannon.Request) => ({
                ...request,
                body: body(),
              }))(opts.request.body),
            }
          : { body: opts.request?.body ?? requestBody(scenario) }),
        onResponse: (status: number, body: string) => {
          if (status >= 200 && status <= 299) return;
          const seen = samples.get(status) ?? [];
          if (seen.length < 3) {
            const { code, message } = describeErrorBody(body);
            seen.push(`HTTP ${status}${code === undefined ? "" : ` ${code}`}: ${message}`);
            samples.set(status, seen);
          }
        },
      },
    ],
  };
  const result = await new Promise<autocannon.Result>((resolve, reject) => {
    const instance = autocannon(options, (error: unknown, res: autocannon.Result) =>
      error ? reject(error instanceof Error ? error : new Error(String(error))) : resolve(res),
    );
    const onResponse = opts.onResponse;
    if (onResponse) instance.on("response", (_client, status) => onResponse(status));
  });
  const statusCodes: Record<string, number> = {};
  for (const [code, stat] of Object.entries(result.statusCodeStats ?? {})) {
    statusCodes[code] = stat.count ?? 0;
  }
  const ok = result["2xx"];
  const responses = Object.values(statusCodes).reduce((a, b) => a + b, 0);
  const seconds = result.duration > 0 ? result.duration : opts.seconds;
  return {
    connections: opts.connections,
    seconds,
    requestsPerSecond: ok / seconds,
    responses,
    ok,
    non2xx: result.non2xx,
    errors: result.errors,
    timeouts: result.timeouts,
    statusCodes,
    latencyMs: {
      p50: result.latency.p50,
      p90: result.latency.p90,
      p99: result.latency.p99,
      mean: result.latency.mean,
      max: result.latency.max,
    },
    errorSamples: [...samples.values()].flat(),
  };
}
