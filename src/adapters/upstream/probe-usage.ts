import { parseChatRequest } from "../../domain/chat/request/index.js";
import type { Usage } from "../../domain/chat/types.js";
import { judgeUsage, toleranceOf, type ReasoningPolicy } from "../../domain/chat/usage.js";
import type { TokenCounter } from "../../domain/tokens.js";
import { CheckFailed, isObject, maxVerificationBytes } from "./probe-io.js";

/**
 * The prober's usage judgement (probe.ts): the answer's text as the gateway counts it, and the
 * provider's usage claim judged against that count.
 */

/** What the probes' usage is counted with. */
export interface Counting {
  readonly counter: TokenCounter;
  readonly reasoning: ReasoningPolicy;
}

/**
 * The generated text of an answer, as the gateway counts it: content, refusals, visible
 * reasoning (`reasoning_content`, `reasoning`), tool-call names and arguments, of every choice
 * (a JSON message or stream deltas).
 */
export class AnswerText {
  text = "";
  reasoning = "";
  toolCalls = 0n;

  add(message: Record<string, unknown>): void {
    for (const key of ["content", "refusal"]) {
      const value = message[key];
      if (typeof value === "string") this.text += value;
    }
    for (const key of ["reasoning_content", "reasoning"]) {
      const value = message[key];
      if (typeof value === "string") this.reasoning += value;
    }
    const calls = message.tool_calls;
    if (!Array.isArray(calls)) return;
    for (const call of calls) {
      const fn = isObject(call) ? call.function : undefined;
      if (!isObject(fn)) continue;
      if (typeof fn.name === "string" && fn.name !== "") this.toolCalls += 1n;
      for (const part of [fn.name, fn.arguments]) {
        if (typeof part === "string") this.text += part;
      }
    }
  }
}

/**
 * Judges the provider's usage claim for `body` and its answer against the gateway's count
 * (`judgeUsage`): a claim of input or output above the count plus tolerance (and the offer's
 * declared hidden reasoning) is a wrong answer, `usage_diverged`, whose message gives the
 * figures (numbers only: nothing the endpoint wrote is repeated).
 */
export async function judgeClaim(
  what: string,
  body: Record<string, unknown>,
  usage: Record<string, unknown>,
  answer: AnswerText,
  { counter, reasoning }: Counting,
): Promise<void> {
  // Hidden reasoning is allowed only as claimed reasoning (judgeUsage): the claim's share of it.
  const details = usage.completion_tokens_details;
  const reasoningClaim =
    typeof details === "object" && details !== null
      ? (details as Record<string, unknown>).reasoning_tokens
      : undefined;
  const claimed: Usage = {
    inputTokens: BigInt(usage.prompt_tokens as number),
    outputTokens: BigInt(usage.completion_tokens as number),
    ...(Number.isSafeInteger(reasoningClaim) && (reasoningClaim as number) >= 0
      ? { reasoningTokens: BigInt(reasoningClaim as number) }
      : {}),
  };
  const request = parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), {
    maxBytes: maxVerificationBytes,
  });
  const reasoningTokens = counter.countOutput(answer.reasoning);
  const counted = {
    inputTokens: await counter.countInput(request),
    outputTokens: counter.countOutput(answer.text) + reasoningTokens,
    reasoningTokens,
    choices: 1n,
    toolCalls: answer.toolCalls,
    exact: counter.exact,
  };
  const judged = judgeUsage(claimed, counted, reasoning);
  if (!judged.diverged) return;
  const tolerance = toleranceOf(counted);
  const hidden = reasoning.hiddenReasoningRatio * counted.outputTokens;
  const counter_ = counter.exact ? `the model's tokenizer (${counter.name})` : "the byte bound";
  if (claimed.inputTokens > counted.inputTokens + tolerance.inputTokens) {
    throw new CheckFailed(
      "usage_diverged",
      `${what}: usage claim ${claimed.inputTokens} input tokens for a prompt the gateway counts ${counted.inputTokens} with ${counter_} (tolerance ${tolerance.inputTokens})`,
    );
  }
  throw new CheckFailed(
    "usage_diverged",
    `${what}: usage claim ${claimed.outputTokens} output tokens for an answer the gateway counts ${counted.outputTokens} with ${counter_} (tolerance ${tolerance.outputTokens}${hidden > 0n ? `, declared hidden reasoning ${hidden}` : ""})`,
  );
}
