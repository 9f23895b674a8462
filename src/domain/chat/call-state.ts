import type { Hex } from "viem";
import { outputLimit, type ChatRequest } from "../chat-request.js";
import { GatewayError } from "../errors.js";
import type { Permit } from "../permits.js";
import { boundCounter, type TokenCounter } from "../tokens.js";
import { decideClose, type CancelledBy, type Outcome } from "./billing.js";
import { RequestClose, type Closes } from "./lifecycle.js";
import type { Closing, Usage } from "./metering.js";
import type { OutputTally } from "./output-tally.js";
import type { ChatInput, ChatObserver, ChatTrace, InferenceDeps } from "./ports.js";
import type { Candidate } from "./routing.js";
import type { ChatCompleted } from "./types.js";
import { judgeUsage, reasoningPolicyOf, type UsageJudgment } from "./usage.js";

/**
 * What one chat call knows of its request, and how its close is decided from it: the base of
 * {@link ChatCall} (call.ts), whose stages fill it in. One object per request; its close is
 * decided in memory (`close`) and recorded exactly once through its {@link RequestClose}.
 */

/** What a call needs of the pipeline. */
export interface RelayContext {
  readonly deps: InferenceDeps;
  readonly closes: Closes;
}

/** An admitted request: what the pipeline reserved, for the call to serve. */
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

/** A request's state as its call serves it, and the decisions of its close. */
export class CallState {
  protected readonly deps: InferenceDeps;
  protected readonly observer: ChatObserver | undefined;
  /** The offer serving the call (another after a failover), and its maximum. */
  protected current: Candidate;
  protected maximumCredits: bigint;
  /** The prompt's tokens as the first offer priced them (a stream's running metering). */
  protected readonly inputBound: bigint;
  /**
   * The gateway's own count of the prompt: made while the provider works (scheduled once the
   * call is sent), read at the close.
   */
  protected inputCount: bigint | undefined = undefined;
  /** The answer's output, counted, and cut at the priced limit (made once an offer answers). */
  protected tally: OutputTally | undefined = undefined;
  /**
   * Whether the request went to a provider: a client that leaves before that is charged
   * nothing (DESIGN.md: input is charged only once the provider has the request).
   */
  protected dispatched = false;
  /**
   * Choices' text pieces relayed so far (streams): the running metering of each chunk (the
   * close counts tokens), and whether output reached the client.
   */
  protected delivered = 0n;
  /** The provider's usage claim in a stream, the last one it sent. */
  protected provided: Usage | undefined = undefined;
  // Metrics: when the provider that answered was called, and when its answer ended.
  protected calledAt = 0;
  protected repliedAt: number | undefined = undefined;
  protected endedAt: number | undefined = undefined;
  /** When the first token of a stream arrived (routing's latency and throughput). */
  protected firstTokenAt: number | undefined = undefined;
  /** The close; pending -> streaming is written while the answer flows, a closing waits for it. */
  protected readonly lifecycle: RequestClose;

  constructor(
    ctx: RelayContext,
    protected readonly s: Served,
  ) {
    this.deps = ctx.deps;
    this.observer = ctx.deps.observer;
    this.current = s.chosen;
    this.maximumCredits = s.maximumCredits;
    this.inputBound = s.chosen.inputTokens;
    this.lifecycle = new RequestClose(ctx.closes, s.requestId, ctx.deps.clock);
  }

  protected countInput(): bigint {
    return (this.inputCount ??= countPrompt(this.s.counter, this.s.req));
  }

  /** What is charged of the provider's claim and the gateway's count (usage.ts). */
  protected judge(claim: Usage | undefined): UsageJudgment {
    const { req, counter } = this.s;
    const { capabilities } = this.current.offer;
    const limit = outputLimit(req, capabilities);
    const output = this.tally?.count() ?? noOutput;
    return judgeUsage(
      claim,
      { inputTokens: this.countInput(), ...output, exact: counter.exact },
      { ...reasoningPolicyOf(capabilities), outputLimit: limit * req.choices },
    );
  }

  /**
   * What the offer's reputation and `provider.sort` count (measurements.ts): an answer the
   * provider completed, with its timing when its first token was seen, or a failure of the
   * provider's. Neither is counted when the client cancelled or the gateway failed.
   */
  protected served(timing?: { outputTokens: bigint; latencyMs: number; generationMs: number }) {
    this.deps.measurements?.served(this.current.offer.offerId, timing);
  }

  protected providerFailed() {
    this.deps.measurements?.failed(this.current.offer.offerId);
  }

  /** What a closing charges, in memory: the answer can go out before the ledger write. */
  protected close(outcome: Outcome): Closing {
    const { current, observer } = this;
    const closing = decideClose(outcome, {
      tariff: current.offer.tariff,
      wakes: current.wakes,
      maximum: this.maximumCredits,
      offerId: current.offer.offerId,
    });
    this.s.trace?.closed(closing);
    // Decided once per request (every path closes through here exactly once).
    if (observer !== undefined && this.dispatched) {
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
  }

  /** Decides and records a close now (the paths that end without a complete answer). */
  protected async closeAs(outcome: Outcome) {
    return this.lifecycle.record(this.close(outcome));
  }

  /** The gateway's count of the output the client was sent (a close without a complete answer). */
  protected deliveredTokens(): bigint {
    return this.tally?.count().outputTokens ?? 0n;
  }

  /** The client left or shutdown cut the call: its input (if dispatched) and the output sent. */
  protected cancelled(): Outcome {
    const { dispatched } = this;
    return {
      kind: "cancelled",
      by: cancelledBy(this.s.input.signal),
      dispatched,
      input: dispatched || this.delivered > 0n ? this.judge(this.provided).charged.inputTokens : 0n,
      delivered: this.deliveredTokens(),
    };
  }

  /**
   * A completed answer's claim against the count: the offer's divergence record (only the
   * offer that answered) and the claim/count metrics.
   */
  protected compared({ claimed, counted }: Closing, diverged: boolean) {
    if (claimed === undefined || counted === undefined) return;
    const { offer } = this.current;
    this.deps.measurements?.claimed(offer.offerId, diverged);
    this.observer?.usageCompared?.(offer.modelId, offer.offerId, claimed, counted);
  }

  protected completedEvent(
    usage: Usage,
    final: Pick<Closing, "charge" | "billing" | "claimed" | "counted">,
    judgment: UsageJudgment,
  ): ChatCompleted {
    const { s } = this;
    const { offer } = this.current;
    return {
      type: "completed",
      requestId: s.requestId,
      quoteId: s.quoteId,
      offerId: offer.offerId,
      tariffVersion: offer.tariff.version,
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

/** Why a cancelled request ended: the client left, or shutdown cut it. */
function cancelledBy(signal: AbortSignal): CancelledBy {
  const reason: unknown = signal.reason;
  return reason instanceof GatewayError && reason.code === "shutting_down" ? "shutdown" : "client";
}
