import type { Hex } from "viem";
import { outputLimit, upstreamBody, type ChatRequest } from "../chat-request.js";
import { GatewayError } from "../errors.js";
import type { Permit } from "../permits.js";
import { boundCounter, type TokenCounter } from "../tokens.js";
import { decideClose, type CancelledBy, type Outcome } from "./billing.js";
import { completionRetries, createRequestClose, type Closes } from "./lifecycle.js";
import {
  deltaTextChoices,
  isUsageOnly,
  StreamMetering,
  usageOf,
  utf8Bytes,
  type Closing,
  type Usage,
} from "./metering.js";
import { OutputTally } from "./output-tally.js";
import type { Candidate } from "./routing.js";
import { consumerStopped, type AnswerSink } from "./sink.js";
import { judgeUsage, reasoningPolicyOf, type UsageJudgment } from "./usage.js";
import type {
  ChatCompleted,
  ChatInput,
  ChatTrace,
  InferenceDeps,
  UpstreamChatOptions,
  UpstreamFlow,
  UpstreamReply,
} from "./types.js";

/**
 * The relay: one admitted request through its provider (failing over before the first byte
 * where routing may), its answer metered event by event as the provider's body pushes them
 * (no promise, generator or iterator result per event), handed to `out` (sink.ts), and its one
 * close.
 */

const encoder = new TextEncoder();

/** What the relay needs of the pipeline. */
export interface RelayContext {
  readonly deps: InferenceDeps;
  readonly closes: Closes;
}

/**
 * One call to an offer's provider, up to its response headers. A connection failure or a
 * 5xx is `retryable` (another offer may serve); a 4xx is the provider refusing this request,
 * which no other offer would answer differently. `providerFault`: the provider failed (no
 * answer, or a 5xx), which counts against its reputation; a 4xx (the client's own input, or a
 * 429 any client can provoke by flooding) and a failure before the provider was called do not.
 *
 * The body carries the output limit priced for this offer ({@link outputLimit} with its
 * capabilities; see {@link upstreamBody}), and a non-streamed call is given the time that
 * output takes ({@link UpstreamChatOptions.answerOutputTokens}).
 */
export async function callProvider(
  deps: Pick<InferenceDeps, "endpoints" | "upstream">,
  offer: { readonly offerId: Hex; readonly capabilities: Record<string, unknown> },
  req: ChatRequest,
  signal: AbortSignal,
): Promise<
  { reply: UpstreamReply } | { failure: GatewayError; retryable: boolean; providerFault: boolean }
> {
  let endpoint: Awaited<ReturnType<typeof deps.endpoints>>;
  try {
    endpoint = await deps.endpoints(offer.offerId);
  } catch (error) {
    // The endpoint could not be read (the database): no provider is called; 503, not 500.
    const failure =
      error instanceof GatewayError
        ? error
        : new GatewayError("database_unavailable", "the offer's endpoint could not be read", {
            cause: error,
          });
    return { failure, retryable: false, providerFault: false };
  }
  if (endpoint === undefined) {
    return {
      failure: new GatewayError("upstream_unavailable", "the offer has no registered endpoint"),
      retryable: true,
      providerFault: false,
    };
  }
  const limit = outputLimit(req, offer.capabilities);
  const options: UpstreamChatOptions = req.stream
    ? { signal }
    : { signal, answerOutputTokens: limit * req.choices };
  let reply: UpstreamReply;
  try {
    reply = await deps.upstream(endpoint, upstreamBody(req, limit), options);
  } catch (error) {
    const failure =
      error instanceof GatewayError
        ? error
        : new GatewayError("upstream_unavailable", "the provider could not be reached");
    // A call the client's cancel aborted is the client's doing: the caller checks that first.
    return { failure, retryable: true, providerFault: true };
  }
  if (reply.status >= 200 && reply.status < 300) return { reply };
  await reply.discard();
  return {
    failure: new GatewayError("upstream_error", `the provider answered HTTP ${reply.status}`),
    retryable: reply.status >= 500,
    providerFault: reply.status >= 500,
  };
}

export interface Served {
  req: ChatRequest;
  input: ChatInput;
  permit: Permit;
  requestId: Hex;
  quoteId: Hex;
  maximumCredits: bigint;
  chosen: Candidate;
  candidates: Candidate[];
  failover: boolean;
  /** `performance.now()` when the pipeline took the request (for the overhead metric). */
  arrivedAt: number;
  /** The call's trace; undefined when tracing is off. */
  trace: ChatTrace | undefined;
  /** The model's token counter: the gateway's own count of what is billed. */
  counter: TokenCounter;
}

export async function serve(ctx: RelayContext, s: Served, out: AnswerSink): Promise<void> {
  const { deps } = ctx;
  const { req, input, requestId, quoteId } = s;
  let current = s.chosen;
  let maximumCredits = s.maximumCredits;
  const inputBound = current.inputTokens;
  // The gateway's own count of the prompt: made while the provider works (scheduled once the
  // call is sent), read at the close.
  let inputCount: bigint | undefined;
  const countInput = (): bigint => (inputCount ??= countPrompt(s.counter, req));
  // The answer's output, counted, and cut at the priced limit (made once an offer answers).
  let tally: OutputTally | undefined;
  /** What is charged of the provider's claim and the gateway's count (usage.ts). */
  const judge = (claim: Usage | undefined): UsageJudgment => {
    const limit = outputLimit(req, current.offer.capabilities);
    const output = tally?.count() ?? noOutput;
    return judgeUsage(
      claim,
      { inputTokens: countInput(), ...output, exact: s.counter.exact },
      { ...reasoningPolicyOf(current.offer.capabilities), outputLimit: limit * req.choices },
    );
  };
  // Whether the request went to a provider: a client that leaves before that is charged
  // nothing (DESIGN.md: input is charged only once the provider has the request).
  let dispatched = false;
  // Choices' text pieces relayed so far (streams): the running metering of each chunk (the
  // close counts tokens), and whether output reached the client.
  let delivered = 0n;
  let provided: Usage | undefined;
  // Metrics: when the provider that answered was called, and when its answer ended.
  const observer = deps.observer;
  let calledAt = 0;
  let repliedAt: number | undefined;
  let endedAt: number | undefined;
  /** When the first token of a stream arrived (routing's latency and throughput). */
  let firstTokenAt: number | undefined;
  /**
   * What the offer's reputation and `provider.sort` count (measurements.ts): an answer the
   * provider completed, with its timing when its first token was seen, or a failure of the
   * provider's. Neither is counted when the client cancelled or the gateway failed.
   */
  const served = (timing?: { outputTokens: bigint; latencyMs: number; generationMs: number }) =>
    deps.measurements?.served(current.offer.offerId, timing);
  const providerFailed = () => deps.measurements?.failed(current.offer.offerId);
  /** What a closing charges, in memory: the answer can go out before the ledger write. */
  const close = (outcome: Outcome): Closing => {
    const closing = decideClose(outcome, {
      tariff: current.offer.tariff,
      wakes: current.wakes,
      maximum: maximumCredits,
      offerId: current.offer.offerId,
    });
    s.trace?.closed(closing);
    // Decided once per request (every path closes through here exactly once).
    if (observer !== undefined && dispatched) {
      observer.charged(
        current.offer.modelId,
        current.offer.offerId,
        closing.usage.inputTokens,
        closing.usage.outputTokens,
        closing.charge,
        {
          cachedInputTokens: closing.usage.cachedInputTokens ?? 0n,
          reasoningTokens: closing.usage.reasoningTokens ?? 0n,
        },
      );
    }
    return closing;
  };
  // pending -> streaming is written while the answer flows; a closing waits for it.
  let marking: Promise<unknown> | undefined;
  const lifecycle = createRequestClose({
    closes: ctx.closes,
    requestId,
    clock: deps.clock,
    beforeWrite: () => marking,
  });
  /** The gateway's count of the output the client was sent (a close without a complete answer). */
  const deliveredTokens = (): bigint => tally?.count().outputTokens ?? 0n;
  /** The client left or shutdown cut the call: its input (if dispatched) and the output sent. */
  const cancelled = (): Outcome => ({
    kind: "cancelled",
    by: cancelledBy(input.signal),
    dispatched,
    input: dispatched || delivered > 0n ? judge(provided).charged.inputTokens : 0n,
    delivered: deliveredTokens(),
  });
  /**
   * A completed answer's claim against the count: the offer's divergence record (only the
   * offer that answered) and the claim/count metrics.
   */
  const compared = ({ claimed, counted }: Closing, diverged: boolean) => {
    if (claimed === undefined || counted === undefined) return;
    deps.measurements?.claimed(current.offer.offerId, diverged);
    observer?.usageCompared?.(current.offer.modelId, current.offer.offerId, claimed, counted);
  };
  const countInputQuietly = () => {
    countInput();
  };
  /** Decides and records a close now (the paths that end without a complete answer). */
  const closeAs = async (outcome: Outcome) => lifecycle.record(close(outcome));

  const abort = new AbortController();
  const onClientAbort = () => abort.abort(input.signal.reason);
  if (input.signal.aborted) onClientAbort();
  else input.signal.addEventListener("abort", onClientAbort, { once: true });

  /** What ended the request before it was decided, for its record's error text. */
  let failedWith: unknown;
  try {
    // 5. Call the provider; before the first byte a connection error or a 5xx may fail over.
    const tried = new Set<Hex>();
    let reply: UpstreamReply | undefined;
    for (;;) {
      tried.add(current.offer.offerId);
      if (input.signal.aborted) throw input.signal.reason;
      calledAt = performance.now();
      if (!dispatched) observer?.overhead((calledAt - s.arrivedAt) / 1000);
      dispatched = true;
      s.trace?.step("upstream");
      const called = callProvider(deps, current.offer, req, abort.signal);
      // Counted while the provider works, not before the call (DESIGN.md 10: no added latency).
      if (inputCount === undefined) setImmediate(countInputQuietly);
      const attempt = await called;
      if (input.signal.aborted) throw input.signal.reason;
      if ("reply" in attempt) {
        reply = attempt.reply;
        repliedAt = calledAt;
        break;
      }
      // Counted also when the request then fails over: the failure was this offer's.
      if (attempt.providerFault) providerFailed();
      if (!attempt.retryable) throw attempt.failure;
      const { failure } = attempt;
      const next = s.failover ? s.candidates.find((c) => !tried.has(c.offer.offerId)) : undefined;
      if (next === undefined)
        throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
      const switched = await deps.ledger.switchOffer({
        requestId,
        offerId: next.offer.offerId,
        maximumCredits: next.maximumCredits,
        tariffVersion: next.offer.tariff.version,
        maxConcurrency: next.offer.maxConcurrency,
        deposit: s.permit.deposit,
        chainSettled: s.permit.settled,
      });
      if (!switched)
        throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
      current = next;
      maximumCredits = next.maximumCredits;
    }

    tally = new OutputTally(s.counter, outputLimit(req, current.offer.capabilities), req.choices);
    await out.started({
      type: "started",
      requestId,
      quoteId,
      offerId: current.offer.offerId,
      tariffVersion: current.offer.tariff.version,
      maximumCredits,
      stream: req.stream,
      replayed: false,
    });

    // 6. Relay and meter.
    if (!req.stream) {
      let text: string;
      try {
        text = await reply.text();
        endedAt = performance.now();
        observer?.firstToken(
          current.offer.modelId,
          current.offer.offerId,
          (endedAt - calledAt) / 1000,
        );
      } catch (error) {
        if (input.signal.aborted) throw error;
        providerFailed();
        await closeAs({ kind: "unreadable" });
        throw error;
      }
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        providerFailed();
        await closeAs({ kind: "invalid_json" });
        throw new GatewayError("upstream_error", "the provider answered invalid JSON");
      }
      const provided = usageOf(body);
      // Output past the priced limit is cut; gateway members are the gateway's to write.
      const cut = tally.addAnswer(body);
      const spoke = dropGatewayMembers(body);
      const judgment = judge(provided);
      const final = close({ kind: "completed", judgment });
      compared(final, judgment.diverged);
      const { usage } = final;
      // Counted, not timed: a JSON answer shows no first token, and its whole time (which a
      // client sets with its output limit) is neither a time to first token nor a stream's pace.
      served();
      lifecycle.answered(final);
      out.chunk(
        {
          type: "chunk",
          data: encoder.encode(cut || spoke ? JSON.stringify(body) : text),
          metering: { ...usage, credits: final.charge },
        },
        body,
      );
      await out.completed(completed(s, current, usage, final, judgment));
      await lifecycle.record(final, completionRetries);
      return;
    }

    // A failed write leaves the request pending, which closes the same way: only a definite
    // "no longer open" stops the answer.
    let lost = false;
    marking = deps.ledger.markStreaming(requestId).then(
      (open) => {
        lost = !open;
      },
      () => undefined,
    );
    // The gateway closed the request while it was served: not the provider's failure.
    let lostError: GatewayError | undefined;
    const lostRequest = () =>
      (lostError = new GatewayError(
        "internal_error",
        "the gateway closed this request while it was being served (its process looked stopped)",
      ));
    // The provider's events, pushed: each is metered, cut and handed on inside the body's read.
    const streamTally = tally;
    let flow: UpstreamFlow | undefined;
    const resume = () => flow?.resume();
    const giveUp = (error: unknown) => flow?.fail(error);
    const relayEvent = (data: string): boolean => {
      if (data === "[DONE]") {
        flow?.stop();
        return false;
      }
      let chunk: unknown;
      try {
        chunk = JSON.parse(data);
        if (ownsGatewayMember(chunk)) return true;
      } catch {
        if (mimicsGatewayFraming(data)) return true;
        chunk = undefined;
      }
      const usage = usageOf(chunk);
      if (usage !== undefined) provided = usage;
      if (lost) throw lostRequest();
      if (isUsageOnly(chunk) && !req.includeUsage) return true;
      // Counted as it passes, and cut at the priced limit (then relayed as rewritten).
      const relayed = chunk === undefined ? undefined : streamTally.addChunk(chunk);
      if (chunk !== undefined && relayed === undefined) return true;
      const pieces = deltaTextChoices(relayed);
      if (pieces > 0n) {
        const first = delivered === 0n;
        delivered += pieces;
        if (first) {
          s.trace?.step("first_token");
          firstTokenAt = performance.now();
          const at = (firstTokenAt - calledAt) / 1000;
          observer?.firstToken(current.offer.modelId, current.offer.offerId, at);
        }
      }
      const more = out.chunk(
        {
          type: "chunk",
          data: utf8Bytes(relayed === chunk ? data : JSON.stringify(relayed)),
          metering: new StreamMetering(current.offer.tariff, maximumCredits, inputBound, delivered),
        },
        relayed,
      );
      // Every choice reached the priced limit: the answer ends here, whatever the provider
      // would send on (its usage claim included; the count stands).
      if (streamTally.done) {
        flow?.stop();
        return false;
      }
      // The client's socket is full: the provider's body waits until it drains.
      if (!more) out.drained().then(resume, giveUp);
      return more;
    };
    try {
      flow = reply.stream(relayEvent);
      await flow.done;
      endedAt = performance.now();
    } catch (error) {
      endedAt = performance.now();
      // The consumer stopped reading: closed below as a client that left (the finally).
      if (error === consumerStopped) throw error;
      // A stream the provider broke off; not one the client left or the gateway lost.
      if (!input.signal.aborted && error !== lostError) providerFailed();
      await closeAs(
        input.signal.aborted
          ? cancelled()
          : { kind: "provider_failed", delivered: deliveredTokens() },
      );
      throw error instanceof GatewayError
        ? error
        : new GatewayError("upstream_error", "the provider failed mid-stream");
    }
    await marking;
    if (lost) {
      // Never report a charge the record does not hold: the orphan rule closed it void.
      await closeAs({ kind: "orphaned", delivered: deliveredTokens() });
      throw lostRequest();
    }
    const judgment = judge(provided);
    const final = close({ kind: "completed", judgment });
    compared(final, judgment.diverged);
    const { usage } = final;
    served(
      firstTokenAt === undefined || endedAt === undefined
        ? undefined
        : {
            outputTokens: usage.outputTokens,
            latencyMs: firstTokenAt - calledAt,
            generationMs: endedAt - firstTokenAt,
          },
    );
    lifecycle.answered(final);
    await out.completed(completed(s, current, usage, final, judgment));
    await lifecycle.record(final, completionRetries);
  } catch (error) {
    failedWith = error;
    throw error;
  } finally {
    input.signal.removeEventListener("abort", onClientAbort);
    if (observer !== undefined && repliedAt !== undefined) {
      const seconds = ((endedAt ?? performance.now()) - repliedAt) / 1000;
      observer.upstreamDone(current.offer.modelId, current.offer.offerId, seconds);
    }
    const pending = lifecycle.pending;
    if (pending !== undefined) {
      // The answer was complete and reported; only its record was still to be written.
      await lifecycle.record(pending, completionRetries);
    } else if (!lifecycle.decided) {
      // The consumer stopped early (client gone between events) or a step before the first
      // byte failed: the reservation still ends, exactly once.
      // A consumer that stops reading after output began is a client that left, even when its
      // signal has not fired (yet): input plus the output it was sent, as the policy says.
      await closeAs(
        input.signal.aborted || delivered > 0n
          ? cancelled()
          : {
              kind: "failed",
              reason: failedWith instanceof GatewayError ? failedWith.message : undefined,
            },
      ).catch(() => undefined);
      abort.abort(consumerStopped);
    }
  }
}

/**
 * A provider chunk with a top-level `x_gateway` member: where the gateway writes its own charge
 * (the last chunk before `[DONE]`). Dropped whole, as if never sent (not metered, its usage not
 * read): a provider must not be able to tell a client what it was charged (DESIGN.md 8). Costs
 * one property lookup on the chunk the relay parses anyway.
 */
function ownsGatewayMember(chunk: unknown): boolean {
  return typeof chunk === "object" && chunk !== null && Object.hasOwn(chunk, "x_gateway");
}

/**
 * Data that is not JSON and holds `[DONE]` or `x_gateway` anywhere: dropped. A standard SSE
 * parser reads it as one event (the REST writer frames every line of it), but the official
 * openai SDK ends a stream on any data that starts with `[DONE]`, and a client that reads SSE
 * line by line would take one of its lines for the gateway's `[DONE]` or final chunk. Only
 * reached when the chunk did not parse (never on the hot path). Valid JSON cannot do either:
 * no line of a JSON text starts with `[DONE]`, and a member is checked above.
 */
function mimicsGatewayFraming(data: string): boolean {
  return data.includes("[DONE]") || data.includes("x_gateway");
}

function completed(
  s: Served,
  offer: Candidate,
  usage: Usage,
  final: Pick<Closing, "charge" | "billing" | "claimed" | "counted">,
  judgment: UsageJudgment,
): ChatCompleted {
  return {
    type: "completed",
    requestId: s.requestId,
    quoteId: s.quoteId,
    offerId: offer.offer.offerId,
    tariffVersion: offer.offer.tariff.version,
    inputTokens: usage.inputTokens,
    outputTokens: usage.outputTokens,
    creditsCharged: final.charge,
    billing: final.billing,
    usageFromProvider: judgment.chargedClaim,
    cachedInputTokens: usage.cachedInputTokens ?? 0n,
    reasoningTokens: usage.reasoningTokens ?? 0n,
    claimed: final.claimed,
    counted: final.counted,
  };
}

const noOutput = { outputTokens: 0n, reasoningTokens: 0n, choices: 0n, toolCalls: 0n };

/**
 * The prompt's tokens by the model's counter. The pipeline refused what the counter cannot
 * count (countInput throws for media it cannot price) before anything was reserved; should it
 * still throw here, the byte bound stands in (a close must not fail on its count).
 */
function countPrompt(counter: TokenCounter, req: ChatRequest): bigint {
  try {
    return counter.countInput(req);
  } catch {
    return boundCounter.countInput(req);
  }
}

/**
 * Removes the members only the gateway writes (`x_gateway`) from a provider's JSON answer
 * (DESIGN.md 10: only the gateway speaks for the gateway). Whether any was there.
 */
function dropGatewayMembers(body: unknown): boolean {
  if (typeof body !== "object" || body === null || !Object.hasOwn(body, "x_gateway")) return false;
  delete (body as Record<string, unknown>)["x_gateway"];
  return true;
}

/** Why a cancelled request ended: the client left, or shutdown cut it. */
function cancelledBy(signal: AbortSignal): CancelledBy {
  const reason: unknown = signal.reason;
  return reason instanceof GatewayError && reason.code === "shutting_down" ? "shutdown" : "client";
}
