import type { EndpointSecret } from "../../domain/health-types.js";
import type { UpstreamClient } from "./http.js";
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
): Promise<{ verdict: FeatureVerdict } | { message: Record<string, unknown> }> {
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
