import type { Hex } from "viem";
import { outputLimit } from "../chat-request.js";
import { GatewayError } from "../errors.js";
import { CallState, type RelayContext, type Served } from "./call-state.js";
import { callProvider } from "./call-provider.js";
import { dropGatewayMembers, mimicsGatewayFraming, ownsGatewayMember } from "./gateway-members.js";
import { completionRetries } from "./lifecycle.js";
import { deltaTextChoices, isUsageOnly, StreamMetering, usageOf, utf8Bytes } from "./metering.js";
import { OutputTally } from "./output-tally.js";
import type { UpstreamFlow, UpstreamReply } from "./ports.js";
import { consumerStopped } from "./sink.js";
import type { AnswerSink } from "./types.js";

export type { RelayContext, Served } from "./call-state.js";

/**
 * One admitted request through its provider (failing over before the first byte where routing
 * may), its answer metered event by event as the provider's body pushes them (no promise,
 * generator or iterator result per event), handed to `out` (the sink contract, types.ts), and
 * its one close: a {@link ChatCall}, one object per request.
 */

const encoder = new TextEncoder();

/** Serves one admitted request (a {@link ChatCall}); settles once its close is recorded. */
export function serve(ctx: RelayContext, s: Served, out: AnswerSink): Promise<void> {
  return new ChatCall(ctx, s, out).serve();
}

/**
 * One request's call: its state (the offer serving it and its maximum, the answer's tally, what
 * was delivered and provided, the timings: {@link CallState}) and its close, decided and
 * recorded exactly once (`RequestClose`, the outbox as for every close). The stages are its
 * methods; the callbacks it hands out are bound once, here.
 */
export class ChatCall extends CallState {
  /** Aborts the provider's call: the client left, or the consumer stopped. */
  private readonly abort = new AbortController();
  /** What ended the request before it was decided, for its record's error text. */
  private failedWith: unknown = undefined;
  /**
   * The gateway closed the request while it was served (its `streaming` mark found it no
   * longer open): a failed write leaves it pending, which closes the same way.
   */
  private lost = false;
  /** The error the answer ended with when it was lost: not the provider's failure. */
  private lostError: GatewayError | undefined = undefined;
  /** The provider's streamed answer, pushed to {@link relay}. */
  private flow: UpstreamFlow | undefined = undefined;
  // Bound once: the callbacks handed to the signal, the timers, the body and the sink.
  private readonly onClientAbort: () => void;
  private readonly countInputQuietly: () => void;
  private readonly relayEvent: (data: string) => boolean;
  private readonly resume: () => void;
  private readonly giveUp: (error: unknown) => void;
  private readonly markedOpen: (open: boolean) => void;

  constructor(
    ctx: RelayContext,
    s: Served,
    private readonly out: AnswerSink,
  ) {
    super(ctx, s);
    this.onClientAbort = this.clientAborted.bind(this);
    this.countInputQuietly = this.countInputOnce.bind(this);
    this.relayEvent = this.relay.bind(this);
    this.resume = this.resumeFlow.bind(this);
    this.giveUp = this.failFlow.bind(this);
    this.markedOpen = this.marked.bind(this);
  }

  async serve(): Promise<void> {
    const { req, input, requestId, quoteId } = this.s;
    const { signal } = input;
    if (signal.aborted) this.onClientAbort();
    else signal.addEventListener("abort", this.onClientAbort, { once: true });
    try {
      // 5. Call the provider; before the first byte a connection error or a 5xx may fail over.
      const reply = await this.dispatch();
      const { offer } = this.current;
      this.tally = new OutputTally(
        this.s.counter,
        outputLimit(req, offer.capabilities),
        req.choices,
      );
      await this.out.started({
        type: "started",
        requestId,
        quoteId,
        offerId: offer.offerId,
        tariffVersion: offer.tariff.version,
        maximumCredits: this.maximumCredits,
        stream: req.stream,
        replayed: false,
      });
      // 6. Relay and meter.
      if (req.stream) await this.answerStream(reply);
      else await this.answerJson(reply);
    } catch (error) {
      this.failedWith = error;
      throw error;
    } finally {
      signal.removeEventListener("abort", this.onClientAbort);
      const { observer, current, lifecycle } = this;
      if (observer !== undefined && this.repliedAt !== undefined) {
        const seconds = ((this.endedAt ?? performance.now()) - this.repliedAt) / 1000;
        observer.upstreamDone(current.offer.modelId, current.offer.offerId, seconds);
      }
      const pending = lifecycle.pending;
      if (pending !== undefined) {
        // The answer was complete and reported; only its record was still to be written.
        await lifecycle.record(pending, completionRetries);
      } else if (!lifecycle.decided) {
        // The consumer stopped early (client gone between events) or a step before the first
        // byte failed: the reservation still ends, exactly once.
        // A consumer that stops reading after output began is a client that left, even when
        // its signal has not fired (yet): input plus the output it was sent, as the policy says.
        const { failedWith } = this;
        await this.closeAs(
          signal.aborted || this.delivered > 0n
            ? this.cancelled()
            : {
                kind: "failed",
                reason: failedWith instanceof GatewayError ? failedWith.message : undefined,
              },
        ).catch(ignore);
        this.abort.abort(consumerStopped);
      }
    }
  }

  /** The offers' calls in turn until one answers (failover before the first byte). */
  private async dispatch(): Promise<UpstreamReply> {
    const { deps, observer, s } = this;
    const { input } = s;
    const tried = new Set<Hex>();
    for (;;) {
      tried.add(this.current.offer.offerId);
      if (input.signal.aborted) throw input.signal.reason;
      this.calledAt = performance.now();
      if (!this.dispatched) observer?.overhead((this.calledAt - s.arrivedAt) / 1000);
      this.dispatched = true;
      s.trace?.step("upstream");
      const called = callProvider(deps, this.current.offer, s.req, this.abort.signal);
      // Counted while the provider works, not before the call (DESIGN.md 10: no added latency).
      if (this.inputCount === undefined) setImmediate(this.countInputQuietly);
      const attempt = await called;
      if (input.signal.aborted) throw input.signal.reason;
      if ("reply" in attempt) {
        this.repliedAt = this.calledAt;
        return attempt.reply;
      }
      // Counted also when the request then fails over: the failure was this offer's.
      if (attempt.providerFault) this.providerFailed();
      if (!attempt.retryable) throw attempt.failure;
      const { failure } = attempt;
      const next = s.failover ? s.candidates.find((c) => !tried.has(c.offer.offerId)) : undefined;
      if (next === undefined)
        throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
      const switched = await deps.ledger.switchOffer({
        requestId: s.requestId,
        offerId: next.offer.offerId,
        maximumCredits: next.maximumCredits,
        tariffVersion: next.offer.tariff.version,
        maxConcurrency: next.offer.maxConcurrency,
        deposit: s.permit.deposit,
        chainSettled: s.permit.settled,
      });
      if (!switched)
        throw new GatewayError("upstream_error", `${failure.message}; no other offer could serve`);
      this.current = next;
      this.maximumCredits = next.maximumCredits;
    }
  }

  /** A JSON answer: read whole, cut at the priced limit, closed, handed on, recorded. */
  private async answerJson(reply: UpstreamReply): Promise<void> {
    const { observer, current, lifecycle } = this;
    const tally = this.tally!;
    let text: string;
    try {
      text = await reply.text();
      this.endedAt = performance.now();
      observer?.firstToken(
        current.offer.modelId,
        current.offer.offerId,
        (this.endedAt - this.calledAt) / 1000,
      );
    } catch (error) {
      if (this.s.input.signal.aborted) throw error;
      this.providerFailed();
      await this.closeAs({ kind: "unreadable" });
      throw error;
    }
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      this.providerFailed();
      await this.closeAs({ kind: "invalid_json" });
      throw new GatewayError("upstream_error", "the provider answered invalid JSON");
    }
    const provided = usageOf(body);
    // Output past the priced limit is cut; gateway members are the gateway's to write.
    const cut = tally.addAnswer(body);
    const spoke = dropGatewayMembers(body);
    const judgment = this.judge(provided);
    const final = this.close({ kind: "completed", judgment });
    this.compared(final, judgment.diverged);
    const { usage } = final;
    // Counted, not timed: a JSON answer shows no first token, and its whole time (which a
    // client sets with its output limit) is neither a time to first token nor a stream's pace.
    this.served();
    lifecycle.answered(final);
    this.out.chunk(
      {
        type: "chunk",
        data: encoder.encode(cut || spoke ? JSON.stringify(body) : text),
        metering: { ...usage, credits: final.charge },
      },
      body,
    );
    await this.out.completed(this.completedEvent(usage, final, judgment));
    await lifecycle.record(final, completionRetries);
  }

  /** A streamed answer: its events pushed through {@link relay}, then closed and recorded. */
  private async answerStream(reply: UpstreamReply): Promise<void> {
    const { lifecycle } = this;
    const { input } = this.s;
    // A failed write leaves the request pending, which closes the same way: only a definite
    // "no longer open" stops the answer.
    lifecycle.before = this.deps.ledger
      .markStreaming(this.s.requestId)
      .then(this.markedOpen, ignore);
    try {
      this.flow = reply.stream(this.relayEvent);
      await this.flow.done;
      this.endedAt = performance.now();
    } catch (error) {
      this.endedAt = performance.now();
      // The consumer stopped reading: closed below as a client that left (the finally).
      if (error === consumerStopped) throw error;
      // A stream the provider broke off; not one the client left or the gateway lost.
      if (!input.signal.aborted && error !== this.lostError) this.providerFailed();
      await this.closeAs(
        input.signal.aborted
          ? this.cancelled()
          : { kind: "provider_failed", delivered: this.deliveredTokens() },
      );
      throw error instanceof GatewayError
        ? error
        : new GatewayError("upstream_error", "the provider failed mid-stream");
    }
    await lifecycle.before;
    if (this.lost) {
      // Never report a charge the record does not hold: the orphan rule closed it void.
      await this.closeAs({ kind: "orphaned", delivered: this.deliveredTokens() });
      throw this.lostRequest();
    }
    const judgment = this.judge(this.provided);
    const final = this.close({ kind: "completed", judgment });
    this.compared(final, judgment.diverged);
    const { usage } = final;
    const { firstTokenAt, endedAt } = this;
    this.served(
      firstTokenAt === undefined || endedAt === undefined
        ? undefined
        : {
            outputTokens: usage.outputTokens,
            latencyMs: firstTokenAt - this.calledAt,
            generationMs: endedAt - firstTokenAt,
          },
    );
    lifecycle.answered(final);
    await this.out.completed(this.completedEvent(usage, final, judgment));
    await lifecycle.record(final, completionRetries);
  }

  /**
   * One provider event, pushed inside the body's read: metered, cut and handed on (the sink
   * contract: no await, never a promise). False pauses the provider's body.
   */
  private relay(data: string): boolean {
    if (data === "[DONE]") {
      this.flow?.stop();
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
    if (usage !== undefined) this.provided = usage;
    if (this.lost) throw this.lostRequest();
    if (isUsageOnly(chunk) && !this.s.req.includeUsage) return true;
    // Counted as it passes, and cut at the priced limit (then relayed as rewritten).
    const tally = this.tally!;
    const relayed = chunk === undefined ? undefined : tally.addChunk(chunk);
    if (chunk !== undefined && relayed === undefined) return true;
    const { offer } = this.current;
    const pieces = deltaTextChoices(relayed);
    if (pieces > 0n) {
      const first = this.delivered === 0n;
      this.delivered += pieces;
      if (first) {
        this.s.trace?.step("first_token");
        this.firstTokenAt = performance.now();
        const at = (this.firstTokenAt - this.calledAt) / 1000;
        this.observer?.firstToken(offer.modelId, offer.offerId, at);
      }
    }
    const more = this.out.chunk(
      {
        type: "chunk",
        data: utf8Bytes(relayed === chunk ? data : JSON.stringify(relayed)),
        metering: new StreamMetering(
          offer.tariff,
          this.maximumCredits,
          this.inputBound,
          this.delivered,
        ),
      },
      relayed,
    );
    // Every choice reached the priced limit: the answer ends here, whatever the provider
    // would send on (its usage claim included; the count stands).
    if (tally.done) {
      this.flow?.stop();
      return false;
    }
    // The client's socket is full: the provider's body waits until it drains.
    if (!more) this.out.drained().then(this.resume, this.giveUp);
    return more;
  }

  private resumeFlow(): void {
    this.flow?.resume();
  }

  private failFlow(error: unknown): void {
    this.flow?.fail(error);
  }

  /** The `streaming` mark landed: false when the request was no longer open. */
  private marked(open: boolean): void {
    this.lost = !open;
  }

  /** The gateway closed the request while it was served: not the provider's failure. */
  private lostRequest(): GatewayError {
    return (this.lostError = new GatewayError(
      "internal_error",
      "the gateway closed this request while it was being served (its process looked stopped)",
    ));
  }

  private clientAborted(): void {
    this.abort.abort(this.s.input.signal.reason);
  }

  private countInputOnce(): void {
    this.countInput();
  }
}

function ignore(): undefined {
  return undefined;
}
