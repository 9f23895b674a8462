import type {
  EndpointProber,
  EndpointSecret,
  EndpointVerification,
  VerificationSubject,
} from "../../domain/health-types.js";
import type { OfferFeature } from "../../domain/offer-features.js";
import {
  boundCounter,
  boundCounters,
  type ModelRef,
  type TokenCounter,
  type TokenCounters,
} from "../../domain/tokens.js";
import { readEventStream } from "./event-stream.js";
import type { UpstreamClient } from "./http.js";
import { checkJsonSchema, checkLogprobs, checkTools } from "./probe-features.js";
import {
  badStatus,
  CheckFailed,
  firstHeader,
  isObject,
  isUsage,
  readJson,
  reason,
  send,
  sendCompletion,
  transportFailed,
} from "./probe-io.js";
import { AnswerText, judgeClaim, type Counting } from "./probe-usage.js";

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
 *
 * Every completion the checks ask for is a prompt the gateway knows, and its answer is read
 * whole: the provider's usage claim is judged against the gateway's own count of both
 * (`judgeUsage`, DESIGN.md section 10), and a claim above the count plus tolerance fails the
 * run (`usage_diverged`, a wrong answer: it clears a standing verification).
 */

export interface ProberOptions {
  /** Deadline of a liveness probe, body included. Default 5 s. */
  readonly livenessTimeoutMs?: number | undefined;
  /** Deadline of each verification step, body included. Default 30 s. */
  readonly verifyTimeoutMs?: number | undefined;
  /** The models' token counters the probes' usage is counted with. Default: the byte bound. */
  readonly counters?: TokenCounters | undefined;
}

/** The prober port of the health monitor, over the pinned upstream client. */
export function createEndpointProber(
  upstream: UpstreamClient,
  opts: ProberOptions = {},
): EndpointProber {
  return {
    probeLiveness: (endpoint, signal) => probeLiveness(upstream, endpoint, opts, signal),
    verifyEndpoint: (endpoint, modelNames, subject) =>
      verifyEndpoint(upstream, endpoint, modelNames, opts, subject),
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
 * 4. honest counting: a completion asking for a short answer with room for many more tokens
 *    (`countingMaxTokens`), JSON then streamed, whose usage claim must not run above the
 *    gateway's count (else `usage_diverged`; the claims of steps 2 and 3 are judged too): a
 *    provider that claims the output limit, or a multiple of the prompt, fails here;
 * 5. optional features, which never fail the run (a feature not proven only keeps offers out
 *    of requests that use it with `provider.require_parameters`): `tools` when a completion
 *    offered one function with `tool_choice` naming it answers a call of it with JSON
 *    arguments; `json_schema` when a completion with a `response_format` JSON schema answers
 *    content that parses as a JSON object; `logprobs` when a temperature-0 completion asking
 *    for log-probabilities answers ones that pass the audits' checks (probe-features.ts). A
 *    check that got no answer (transport) is reported `unanswered`, so the feature's standing
 *    value is kept.
 *
 * `subject` names the model whose token counter counts (and the offer's declared hidden
 * reasoning); without it, the byte bound counts and no hidden reasoning is allowed.
 *
 * Never throws.
 */
export async function verifyEndpoint(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  modelNames: readonly string[],
  opts: ProberOptions = {},
  subject?: VerificationSubject,
): Promise<EndpointVerification> {
  const timeoutMs = opts.verifyTimeoutMs ?? 30_000;
  try {
    const counting: Counting = {
      counter:
        subject === undefined
          ? boundCounter
          : await counterOf(opts.counters ?? boundCounters, subject.model),
      reasoning: subject?.reasoning ?? { hiddenReasoningRatio: 0n },
    };
    const model = await checkModelListed(upstream, endpoint, modelNames, timeoutMs);
    await checkCompletion(upstream, endpoint, model, timeoutMs, counting);
    await checkStream(upstream, endpoint, model, timeoutMs, counting);
    for (const stream of [false, true]) {
      await checkCounting(upstream, endpoint, model, timeoutMs, counting, stream);
    }
    // The optional features (`provider.require_parameters`): their checks never fail the run.
    const features: OfferFeature[] = ["stream_usage"];
    const unanswered: OfferFeature[] = [];
    for (const [feature, check] of [
      ["tools", checkTools],
      ["json_schema", checkJsonSchema],
      ["logprobs", checkLogprobs],
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
  counting: Counting,
): Promise<void> {
  const body = { model, messages: probeMessages, max_tokens: 1, stream: false };
  await jsonCompletion(
    upstream,
    endpoint,
    body,
    timeoutMs,
    counting,
    "a one-token chat completion",
  );
}

/**
 * A JSON completion of `body` that must answer 200 with a `choices` array (else
 * `completion_failed`) and a usage (else `usage_missing`) that the gateway's count of the
 * prompt and the answer does not contradict (else `usage_diverged`).
 */
async function jsonCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  body: Record<string, unknown>,
  timeoutMs: number,
  counting: Counting,
  what: string,
): Promise<void> {
  const { response, signal } = await sendCompletion(upstream, endpoint, body, timeoutMs, what);
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
  const answer = new AnswerText();
  for (const choice of completion.choices) {
    if (isObject(choice) && isObject(choice.message)) answer.add(choice.message);
  }
  await judgeClaim(what, body, completion.usage as Record<string, unknown>, answer, counting);
}

async function checkStream(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
  counting: Counting,
): Promise<void> {
  const body = {
    model,
    messages: probeMessages,
    max_tokens: 1,
    stream: true,
    stream_options: { include_usage: true },
  };
  await streamedCompletion(
    upstream,
    endpoint,
    body,
    timeoutMs,
    counting,
    "a streamed one-token chat completion",
  );
}

/**
 * A streamed completion of `body` that must answer 200 `text/event-stream` whose events are
 * JSON and end with `[DONE]` (else `stream_failed`), with a usage (else `usage_missing`) that
 * the gateway's count of the prompt and the streamed answer does not contradict (else
 * `usage_diverged`).
 */
async function streamedCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  body: Record<string, unknown>,
  timeoutMs: number,
  counting: Counting,
  what: string,
): Promise<void> {
  const { response, signal } = await sendCompletion(upstream, endpoint, body, timeoutMs, what);
  if (response.status !== 200) throw await badStatus(response, "stream_failed", what);
  const contentType = firstHeader(response.headers["content-type"]);
  if (!/^text\/event-stream\s*(;|$)/i.test(contentType ?? "")) {
    await response.dump();
    throw new CheckFailed("stream_failed", `${what} did not answer text/event-stream`);
  }
  let done = false;
  let usage: Record<string, unknown> | undefined;
  const answer = new AnswerText();
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
      if (isUsage(chunk.usage) && isObject(chunk.usage)) usage = chunk.usage;
      if (Array.isArray(chunk.choices)) {
        for (const choice of chunk.choices) {
          if (isObject(choice) && isObject(choice.delta)) answer.add(choice.delta);
        }
      }
    }
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    throw transportFailed(`${what} broke off: ${reason(err, signal, timeoutMs)}`);
  } finally {
    // Anything after [DONE] is not read; closing the body frees (or drops) the connection.
    await events.return();
  }
  if (!done) throw new CheckFailed("stream_failed", `${what} ended without data: [DONE]`);
  if (usage === undefined) {
    throw new CheckFailed(
      "usage_missing",
      `${what} carried no usage although stream_options.include_usage was set`,
    );
  }
  await judgeClaim(what, body, usage, answer, counting);
}

/**
 * The output limit of the counting check: far more than the short answer asked for, so a
 * provider that claims the limit it was given (or any large share of it) claims more than it
 * answered, by more than any tolerance; small enough that an honest model that does not stop
 * early still answers within the step's deadline.
 */
export const countingMaxTokens = 200;

const countingMessages = [
  { role: "system", content: "You answer in as few words as possible." },
  { role: "user", content: "Name the three primary colours, separated by commas." },
];

/** Step 4: a short answer with room for many tokens, JSON or streamed; its claim judged. */
async function checkCounting(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  model: string,
  timeoutMs: number,
  counting: Counting,
  stream: boolean,
): Promise<void> {
  const body = { model, messages: countingMessages, max_tokens: countingMaxTokens };
  if (!stream) {
    await jsonCompletion(
      upstream,
      endpoint,
      { ...body, stream: false },
      timeoutMs,
      counting,
      "a chat completion whose usage the gateway counts",
    );
    return;
  }
  await streamedCompletion(
    upstream,
    endpoint,
    { ...body, stream: true, stream_options: { include_usage: true } },
    timeoutMs,
    counting,
    "a streamed chat completion whose usage the gateway counts",
  );
}

const probeMessages = [{ role: "user", content: "Reply with OK." }];

function sameModelName(expected: string, listed: string): boolean {
  if (expected === listed) return true;
  // A ModelID may be spelled in either hex case.
  return /^0x[0-9a-f]+$/i.test(expected) && expected.toLowerCase() === listed.toLowerCase();
}

/**
 * The model's counter for a verification: loaded first if it is not yet (a verification runs
 * off any client's request path, and its offer is not routable before it passes).
 */
async function counterOf(counters: TokenCounters, model: ModelRef): Promise<TokenCounter> {
  const loaded = counters.forModel(model);
  if (loaded !== undefined) return loaded;
  await counters.preload([model]);
  return counters.forModel(model) ?? boundCounter;
}
