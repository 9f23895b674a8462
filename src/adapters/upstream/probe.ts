import { GatewayError } from "../../domain/errors.js";
import { BaseError } from "../../errors.js";
import type {
  EndpointProber,
  EndpointSecret,
  EndpointVerification,
  VerificationCheck,
} from "../../domain/health.js";
import type { OfferFeature } from "../../domain/offer-features.js";
import { readEventStream, type UpstreamClient, type UpstreamResponse } from "./http.js";

/**
 * Liveness probes and the conformance checks a provider endpoint must pass before the gateway
 * routes chat to it. Every message produced here is safe to show to the provider and to log:
 * none contains the endpoint URL, its host, or its token, and none repeats what the endpoint
 * answered (an endpoint could echo anything back).
 *
 * A failure is either a wrong answer (the endpoint answered, and not as the checks require) or
 * a transport failure (no answer: timeout, refused or reset connection, HTTP 408, 429 or 5xx, a
 * stream broken off or reporting an error). Only a wrong answer clears a standing verification
 * (DESIGN.md section 8): a transport failure is what a flood of verifications, or a provider's
 * passing overload, produces, and says nothing about whether the endpoint conforms. Transport
 * failures always carry the check `endpoint_unreachable`, so its code tells the caller the
 * verification was left as it stood.
 */

export interface ProberOptions {
  /** Deadline of a liveness probe, body included. Default 5 s. */
  readonly livenessTimeoutMs?: number | undefined;
  /** Deadline of each verification step, body included. Default 30 s. */
  readonly verifyTimeoutMs?: number | undefined;
}

/** Largest answer read during verification (model lists can be long, completions are one token). */
const maxVerificationBytes = 1024 * 1024;

/** The prober port of the health monitor, over the pinned upstream client. */
export function createEndpointProber(
  upstream: UpstreamClient,
  opts: ProberOptions = {},
): EndpointProber {
  return {
    probeLiveness: (endpoint, signal) => probeLiveness(upstream, endpoint, opts, signal),
    verifyEndpoint: (endpoint, modelNames) => verifyEndpoint(upstream, endpoint, modelNames, opts),
  };
}

/** Whether `GET /v1/models` answers 2xx within the liveness deadline. Never throws. */
export async function probeLiveness(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  opts: ProberOptions = {},
  signal?: AbortSignal,
): Promise<boolean> {
  const timeoutMs = opts.livenessTimeoutMs ?? 5_000;
  const deadline = AbortSignal.timeout(timeoutMs);
  try {
    const response = await upstream.request(endpoint, "/v1/models", {
      method: "GET",
      headers: { accept: "application/json" },
      signal: signal === undefined ? deadline : AbortSignal.any([signal, deadline]),
      timeoutMs,
    });
    await response.dump();
    return response.status >= 200 && response.status < 300;
  } catch {
    return false;
  }
}

/**
 * Runs the conformance checks in order and reports the first that fails:
 *
 * 1. `GET /v1/models` answers 2xx (else `endpoint_unreachable`) with an OpenAI model list
 *    naming one of `modelNames` (else `model_not_listed`; ModelIDs match in any hex case);
 * 2. a non-streaming one-token completion of that model answers 200 with a `choices` array
 *    (else `completion_failed`) and a usage with integer prompt and completion tokens (else
 *    `usage_missing`);
 * 3. the same completion with `stream: true, stream_options: {include_usage: true}` answers
 *    200 `text/event-stream` whose events are JSON and end with `[DONE]` (else
 *    `stream_failed`) and carry a usage object (else `usage_missing`): `stream_usage` proven;
 * 4. optional features, which never fail the run (a feature not proven only keeps offers out
 *    of requests that use it with `provider.require_parameters`): `tools` when a completion
 *    offered one function with `tool_choice` naming it answers a call of it with JSON
 *    arguments; `json_schema` when a completion with a `response_format` JSON schema answers
 *    content that parses as a JSON object. A check that got no answer (transport) is reported
 *    `unanswered`, so the feature's standing value is kept.
 *
 * Never throws.
 */
export async function verifyEndpoint(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  modelNames: readonly string[],
  opts: ProberOptions = {},
): Promise<EndpointVerification> {
  const timeoutMs = opts.verifyTimeoutMs ?? 30_000;
  try {
    const model = await checkModelListed(upstream, endpoint, modelNames, timeoutMs);
    await checkCompletion(upstream, endpoint, model, timeoutMs);
    await checkStream(upstream, endpoint, model, timeoutMs);
    // The optional features (`provider.require_parameters`): their checks never fail the run.
    const features: OfferFeature[] = ["stream_usage"];
    const unanswered: OfferFeature[] = [];
    for (const [feature, check] of [
      ["tools", checkTools],
      ["json_schema", checkJsonSchema],
    ] as const) {
      const verdict = await check(upstream, endpoint, model, timeoutMs);
      if (verdict === "proven") features.push(feature);
      else if (verdict === "unanswered") unanswered.push(feature);
    }
    return { ok: true, features, unanswered };
  } catch (err) {
    if (err instanceof CheckFailed) {
      return { ok: false, check: err.check, message: err.message, transport: err.transport };
    }
    // Not expected (every step maps its own failures); never a pass, and no verdict either.
    return {
      ok: false,
      check: "endpoint_unreachable",
      message: "the endpoint could not be checked",
      transport: true,
    };
  }
}

class CheckFailed extends BaseError {
  readonly reason = "verification_check_failed";
  override readonly name = "CheckFailed";
  constructor(
    readonly check: VerificationCheck,
    message: string,
    readonly transport = false,
  ) {
    super(message);
  }
}

/** No answer was had: the failure says nothing about whether the endpoint conforms. */
function transportFailed(message: string): CheckFailed {
  return new CheckFailed("endpoint_unreachable", message, true);
}

/** Statuses that say "not now" (timeout, rate limit, server failure), not "not like this". */
function isTransportStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/** A non-success status: a transport failure, or a wrong answer failing `check`. */
async function badStatus(
  response: UpstreamResponse,
  check: VerificationCheck,
  what: string,
): Promise<CheckFailed> {
  await response.dump();
  const message = `${what} answered HTTP ${response.status}`;
  return isTransportStatus(response.status)
    ? transportFailed(message)
    : new CheckFailed(check, message);
}

async function send(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  path: string,
  body: unknown,
  timeoutMs: number,
  what: string,
): Promise<{ response: UpstreamResponse; signal: AbortSignal }> {
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const response = await upstream.request(endpoint, path, {
      method: body === undefined ? "GET" : "POST",
      headers:
        body === undefined
          ? { accept: "application/json" }
          : { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      timeoutMs,
    });
    return { response, signal };
  } catch (err) {
    throw transportFailed(`${what} failed: ${reason(err, signal, timeoutMs)}`);
  }
}

async function readJson(
  response: UpstreamResponse,
  signal: AbortSignal,
  timeoutMs: number,
  check: VerificationCheck,
  what: string,
): Promise<unknown> {
  let text: string;
  try {
    text = await response.text(maxVerificationBytes);
  } catch (err) {
    // Cut off or timed out while reading: no complete answer to judge.
    throw transportFailed(`${what}: ${reason(err, signal, timeoutMs)}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new CheckFailed(check, `${what}: the answer is not valid JSON`);
  }
}

async function checkModelListed(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  modelNames: readonly string[],
  timeoutMs: number,
): Promise<string> {
  const what = "GET /v1/models";
  const { response, signal } = await send(
    upstream,
    endpoint,
    "/v1/models",
    undefined,
    timeoutMs,
    what,
  );
  // Any other answer (401, 404, a redirect...) is the endpoint's: it lists no model for us.
  if (response.status < 200 || response.status > 299) {
    throw await badStatus(response, "model_not_listed", what);
  }
  const list = await readJson(response, signal, timeoutMs, "model_not_listed", what);
  const data = isObject(list) ? list.data : undefined;
  if (!Array.isArray(data)) {
    throw new CheckFailed("model_not_listed", `${what} did not answer an OpenAI model list`);
  }
  const listed = data.flatMap((m) => (isObject(m) && typeof m.id === "string" ? [m.id] : []));
  for (const id of listed) {
    if (modelNames.some((name) => sameModelName(name, id))) return id;
  }
  throw new CheckFailed(
    "model_not_listed",
    `${what} does not list the offer's model (expected one of: ${modelNames.join(", ")})`,
  );
}

async function checkCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
): Promise<void> {
  const what = "a one-token chat completion";
  const { response, signal } = await send(
    upstream,
    endpoint,
    "/v1/chat/completions",
    { model, messages: probeMessages, max_tokens: 1, stream: false },
    timeoutMs,
    what,
  );
  if (response.status !== 200) throw await badStatus(response, "completion_failed", what);
  const completion = await readJson(response, signal, timeoutMs, "completion_failed", what);
  if (!isObject(completion) || !Array.isArray(completion.choices)) {
    throw new CheckFailed("completion_failed", `${what} answered without a choices array`);
  }
  if (!isUsage(completion.usage)) {
    throw new CheckFailed(
      "usage_missing",
      `${what} answered without usage (integer prompt_tokens and completion_tokens)`,
    );
  }
}

async function checkStream(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
): Promise<void> {
  const what = "a streamed one-token chat completion";
  const { response, signal } = await send(
    upstream,
    endpoint,
    "/v1/chat/completions",
    {
      model,
      messages: probeMessages,
      max_tokens: 1,
      stream: true,
      stream_options: { include_usage: true },
    },
    timeoutMs,
    what,
  );
  if (response.status !== 200) throw await badStatus(response, "stream_failed", what);
  const contentType = firstHeader(response.headers["content-type"]);
  if (!/^text\/event-stream\s*(;|$)/i.test(contentType ?? "")) {
    await response.dump();
    throw new CheckFailed("stream_failed", `${what} did not answer text/event-stream`);
  }
  let done = false;
  let usage = false;
  const events = readEventStream(response.body);
  try {
    for await (const event of events) {
      if (event.data === "[DONE]") {
        done = true;
        break;
      }
      let chunk: unknown;
      try {
        chunk = JSON.parse(event.data);
      } catch {
        throw new CheckFailed("stream_failed", `${what} sent an event that is not JSON`);
      }
      if (!isObject(chunk)) {
        throw new CheckFailed("stream_failed", `${what} sent an event that is not a JSON object`);
      }
      // The stream's own 5xx: the provider says it failed this time, not that it cannot.
      if (chunk.error !== undefined) {
        throw transportFailed(`${what} reported an error in the stream`);
      }
      if (isUsage(chunk.usage)) usage = true;
    }
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    throw transportFailed(`${what} broke off: ${reason(err, signal, timeoutMs)}`);
  } finally {
    // Anything after [DONE] is not read; closing the body frees (or drops) the connection.
    await events.return();
  }
  if (!done) throw new CheckFailed("stream_failed", `${what} ended without data: [DONE]`);
  if (!usage) {
    throw new CheckFailed(
      "usage_missing",
      `${what} carried no usage although stream_options.include_usage was set`,
    );
  }
}

const probeMessages = [{ role: "user", content: "Reply with OK." }];

type FeatureVerdict = "proven" | "not_proven" | "unanswered";

/** One optional feature's completion: its parsed answer, or the verdict it already gives. */
async function featureCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  body: object,
  timeoutMs: number,
  what: string,
): Promise<{ verdict: FeatureVerdict } | { message: Record<string, unknown> }> {
  try {
    const { response, signal } = await send(
      upstream,
      endpoint,
      "/v1/chat/completions",
      body,
      timeoutMs,
      what,
    );
    if (response.status !== 200) {
      const failure = await badStatus(response, "completion_failed", what);
      return { verdict: failure.transport ? "unanswered" : "not_proven" };
    }
    const completion = await readJson(response, signal, timeoutMs, "completion_failed", what);
    const choice =
      isObject(completion) && Array.isArray(completion.choices) ? completion.choices[0] : undefined;
    const message = isObject(choice) ? choice.message : undefined;
    return isObject(message) ? { message } : { verdict: "not_proven" };
  } catch (err) {
    if (err instanceof CheckFailed) return { verdict: err.transport ? "unanswered" : "not_proven" };
    return { verdict: "unanswered" };
  }
}

const probeTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};

/** `tools`: a completion that must call the one function it is offered, by name. */
async function checkTools(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
): Promise<FeatureVerdict> {
  const answer = await featureCompletion(
    upstream,
    endpoint,
    {
      model,
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      tools: [probeTool],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 64,
      stream: false,
    },
    timeoutMs,
    "a chat completion with a tool",
  );
  if ("verdict" in answer) return answer.verdict;
  const calls = answer.message.tool_calls;
  const call = Array.isArray(calls) && isObject(calls[0]) ? calls[0].function : undefined;
  if (!isObject(call) || call.name !== "get_weather" || typeof call.arguments !== "string") {
    return "not_proven";
  }
  return parsesAsObject(call.arguments) ? "proven" : "not_proven";
}

/** `json_schema`: a completion whose `response_format` is a JSON schema must answer JSON. */
async function checkJsonSchema(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
): Promise<FeatureVerdict> {
  const answer = await featureCompletion(
    upstream,
    endpoint,
    {
      model,
      messages: [{ role: "user", content: "Answer OK as JSON." }],
      response_format: {
        type: "json_schema",
        json_schema: {
          name: "answer",
          strict: true,
          schema: {
            type: "object",
            properties: { answer: { type: "string" } },
            required: ["answer"],
            additionalProperties: false,
          },
        },
      },
      max_tokens: 64,
      stream: false,
    },
    timeoutMs,
    "a chat completion with a JSON schema",
  );
  if ("verdict" in answer) return answer.verdict;
  const content = answer.message.content;
  return typeof content === "string" && parsesAsObject(content) ? "proven" : "not_proven";
}

function parsesAsObject(text: string): boolean {
  try {
    return isObject(JSON.parse(text));
  } catch {
    return false;
  }
}

function sameModelName(expected: string, listed: string): boolean {
  if (expected === listed) return true;
  // A ModelID may be spelled in either hex case.
  return /^0x[0-9a-f]+$/i.test(expected) && expected.toLowerCase() === listed.toLowerCase();
}

function isUsage(value: unknown): boolean {
  return (
    isObject(value) && isTokenCount(value.prompt_tokens) && isTokenCount(value.completion_tokens)
  );
}

function isTokenCount(value: unknown): boolean {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function firstHeader(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** Why a step failed, in words that never name the endpoint. */
function reason(err: unknown, signal: AbortSignal, timeoutMs: number): string {
  if (signal.aborted) return `no complete answer within ${timeoutMs} ms`;
  // GatewayErrors from the upstream client are written not to contain the endpoint.
  if (err instanceof GatewayError) return err.message;
  return "unexpected error";
}
