import { GatewayError } from "../errors.js";
import { decideClose, type CancelledBy, type Outcome } from "./billing.js";
import { completionRetries, RequestClose, type Closes } from "./lifecycle.js";
import type { SignedUsageReceipt } from "../receipt-types.js";
import type { Closing } from "./metering.js";
import type { Usage } from "./types.js";
import type { OutputTally } from "./output-tally.js";
import type { Admission } from "./admission.js";
import type { ChatObserver, InferenceDeps } from "./ports.js";
import type { Candidate } from "./routing.js";
import type { ChatCompleted } from "./types.js";
import {
  defaultHiddenReasoningRatioMax,
  judgeUsage,
  usagePolicyOf,
  type UsageJudgment,
} from "./usage.js";

/**
 * What one chat call knows of its request, and how its close is decided from it: the state a
 * {@link ChatCall} (call.ts) holds and its stages fill in. One object per request; its close is
 * decided in memory (`close`) and recorded exactly once through its {@link RequestClose}.
 */

/** What a call needs of the pipeline. */
export interface RelayContext {
  readonly deps: InferenceDeps;
  readonly closes: Closes;
}

/** A request's state as its call serves it, and the decisions of its close. */
export class CallState {
  readonly deps: InferenceDeps;
  readonly observer: ChatObserver | undefined;
  /** The offer serving the call (another after a failover), and its maximum. */
  current: Candidate;
  maximumCredits: bigint;
  /** The prompt's tokens as the first offer priced them (a stream's running metering). */
  readonly inputBound: bigint;
  /** The answer's output, counted, and cut at the priced limit (made once an offer answers). */
  tally: OutputTally | undefined = undefined;
  /**
   * Whether the request went to a provider: a client that leaves before that is charged
   * nothing (DESIGN.md: input is charged only once the provider has the request).
   */
  dispatched = false;
  /**
   * Choices' text pieces relayed so far (streams): the running metering of each chunk (the
   * close counts tokens), and whether output reached the client.
   */
  delivered = 0n;
  /** The provider's usage claim in a stream, the last one it sent. */
  provided: Usage | undefined = undefined;
  // Metrics: when the provider that answered was called, and when its answer ended.
  calledAt = 0;
  repliedAt: number | undefined = undefined;
  endedAt: number | undefined = undefined;
  /** When the first token of a stream arrived (routing's latency and throughput). */
  firstTokenAt: number | undefined = undefined;
  /** The close; pending -> streaming is written while the answer flows, a closing waits for it. */
  readonly lifecycle: RequestClose;

  constructor(
    ctx: RelayContext,
    readonly admission: Admission,
  ) {
    this.deps = ctx.deps;
    this.observer = ctx.deps.observer;
    this.current = admission.chosen;
    this.maximumCredits = admission.maximumCredits;
    this.inputBound = admission.chosen.inputTokens;
    this.lifecycle = new RequestClose(ctx.closes, admission.requestId, ctx.deps.clock);
  }

  /** What is charged of the provider's claim and the gateway's count (usage.ts). */
  judge(claim: Usage | undefined): UsageJudgment {
    const { req, counter } = this.admission;
    const { tariff } = this.current.offer;
    const output = this.tally?.count() ?? noOutput;
    return judgeUsage(
      claim,
      { inputTokens: this.admission.inputCount, ...output, exact: counter.exact },
      usagePolicyOf({
        tariff,
        hidesReasoning: counter.hidesReasoning,
        ratioMax: this.deps.hiddenReasoningRatioMax ?? defaultHiddenReasoningRatioMax,
        outputBound: this.current.maxOutputTokens,
        stop: req.stop,
        countOutput: (text) => counter.countOutput(text),
      }),
    );
  }

  /**
   * What the offer's reputation and `provider.sort` count (reputation/measurements.ts): an answer the
   * provider completed, with its timing when its first token was seen, or a failure of the
   * provider's. Neither is counted when the client cancelled or the gateway failed.
   */
  served(timing?: { outputTokens: bigint; latencyMs: number; generationMs: number }) {
    this.deps.measurements?.served(this.current.offer.offerId, timing);
  }

  providerFailed() {
    this.deps.measurements?.failed(this.current.offer.offerId);
  }

  /** What a closing charges, in memory: the answer can go out before the ledger write. */
  close(outcome: Outcome): Closing {
    const { current, observer } = this;
    const closing = decideClose(outcome, {
      tariff: current.offer.tariff,
      wakes: current.wakes,
      maximum: this.maximumCredits,
      offerId: current.offer.offerId,
    });
    this.admission.trace?.closed(closing);
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
  async closeAs(outcome: Outcome) {
    return this.lifecycle.record(this.close(outcome));
  }

  /** The gateway's count of the output the client was sent (a close without a complete answer). */
  deliveredTokens(): bigint {
    return this.tally?.count().outputTokens ?? 0n;
  }

  /** The client left or shutdown cut the call: its input (if dispatched) and the output sent. */
  cancelled(): Outcome {
    const { dispatched } = this;
    return {
      kind: "cancelled",
      by: cancelledBy(this.admission.input.signal),
      dispatched,
      input: dispatched || this.delivered > 0n ? this.judge(this.provided).charged.inputTokens : 0n,
      delivered: this.deliveredTokens(),
    };
  }

  /**
   * Records the close first, then signs the receipt of the record it wrote (the one `GET
   * /v1/requests/{id}/receipt` signs later: the same fields, so the same signature). None when
   * the ledger did not take the close now (it waits in the outbox), nothing was charged, or
   * the signer failed: the stream still ends, and the receipt is there to ask for.
   */
  async recordForReceipt(final: Closing): Promise<SignedUsageReceipt | undefined> {
    const { admission } = this;
    const { offer } = this.current;
    const recorded = await this.lifecycle.record(final, completionRetries);
    if (!recorded.written || recorded.creditsCharged === 0n) return undefined;
    const { close } = recorded;
    try {
      // The record as the close wrote it, with the ids the request was reserved under.
      return await admission.receipt!({
        ...close,
        id: admission.requestId,
        permitId: admission.permit.permitId,
        offerId: offer.offerId,
        modelId: offer.modelId,
        tariffVersion: offer.tariff.version,
        cachedInputTokens: close.cachedInputTokens ?? 0n,
        reasoningTokens: close.reasoningTokens ?? 0n,
        creditsCharged: recorded.creditsCharged,
        completedAt: close.now,
        claimed: close.claimed ?? null,
        counted: close.counted ?? null,
      });
    } catch {
      return undefined;
    }
  }

  /**
   * A completed answer's claim against the count: the offer's divergence record (only the
   * offer that answered) and the claim/count metrics.
   */
  compared({ claimed, counted }: Closing, diverged: boolean) {
    if (claimed === undefined || counted === undefined) return;
    const { offer } = this.current;
    this.deps.measurements?.claimed(offer.offerId, diverged, this.admission.permit.payer);
    this.observer?.usageCompared?.(offer.modelId, offer.offerId, claimed, counted);
  }

  completedEvent(
    usage: Usage,
    final: Pick<Closing, "charge" | "billing" | "claimed" | "counted">,
    judgment: UsageJudgment,
  ): ChatCompleted {
    const { requestId, quoteId } = this.admission;
    const { offer } = this.current;
    return {
      type: "completed",
      requestId,
      quoteId,
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
      ...(this.admission.budgetWarning === undefined
        ? {}
        : { budgetWarning: this.admission.budgetWarning }),
    };
  }
}

const noOutput = {
  outputTokens: 0n,
  reasoningTokens: 0n,
  choices: 0n,
  toolCalls: 0n,
  stopped: 0n,
};

/** Why a cancelled request ended: the client left, or shutdown cut it. */
function cancelledBy(signal: AbortSignal): CancelledBy {
  const reason: unknown = signal.reason;
  return reason instanceof GatewayError && reason.code === "shutting_down" ? "shutdown" : "client";
}
