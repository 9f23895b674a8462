import type { EndpointSecret } from "../../domain/health-types.js";
import type { UpstreamClient } from "./http.js";
import { answerLogprobs, logprobFault } from "../../domain/audits/logprobs.js";
import { badStatus, CheckFailed, isObject, readJson, sendCompletion } from "./probe-io.js";

/**
 * The prober's checks of the optional features (`provider.require_parameters`): each answers
 * proven, not proven, or unanswered, and never fails a verification.
 */

export type FeatureVerdict = "proven" | "not_proven" | "unanswered";

/** One optional feature's completion: its parsed answer, or the verdict it already gives. */
async function featureCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  body: object,
  timeoutMs: number,
  what: string,
): Promise<
  { verdict: FeatureVerdict } | { message: Record<string, unknown>; completion: unknown }
> {
  try {
    const { response, signal } = await sendCompletion(upstream, endpoint, body, timeoutMs, what);
    if (response.status !== 200) {
      const failure = await badStatus(response, "completion_failed", what);
      return { verdict: failure.transport ? "unanswered" : "not_proven" };
    }
    const completion = await readJson(response, signal, timeoutMs, "completion_failed", what);
    const choice =
      isObject(completion) && Array.isArray(completion.choices) ? completion.choices[0] : undefined;
    const message = isObject(choice) ? choice.message : undefined;
    return isObject(message) ? { message, completion } : { verdict: "not_proven" };
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
export async function checkTools(
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
export async function checkJsonSchema(
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

/**
 * `logprobs`: a temperature-0 completion asking for log-probabilities (and 5 alternatives) must
 * answer them for its first choice, and they must pass the checks the logprob audits apply
 * (domain/audits/logprobs.ts): the scored tokens spell the text, every value is a
 * log-probability, no alternative is more probable than the token sent, their mass is at most
 * 1. An offer with it also gets logprob audits (docs/decisions/audits.md).
 */
export async function checkLogprobs(
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
      messages: [{ role: "user", content: "Name three colours." }],
      logprobs: true,
      top_logprobs: 5,
      temperature: 0,
      max_tokens: 8,
      stream: false,
    },
    timeoutMs,
    "a chat completion with log-probabilities",
  );
  if ("verdict" in answer) return answer.verdict;
  const content = answer.message.content;
  const entries = answerLogprobs([answer.completion]);
  if (typeof content !== "string" || entries === undefined || entries.length === 0)
    return "not_proven";
  return logprobFault(entries, content, true) === undefined ? "proven" : "not_proven";
}
