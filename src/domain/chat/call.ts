import { dialects } from "../dialects/index.js";
import { GatewayError } from "../errors.js";
import type { Admission } from "./admission.js";
import { CallState, type RelayContext } from "./call-state.js";
import { dispatch } from "./call-provider.js";
import { dropGatewayMembers, mimicsGatewayFraming, ownsGatewayMember } from "./gateway-members.js";
import { completionRetries } from "./lifecycle.js";
import {
  deltaTextChoices,
  hasUsage,
  isUsageOnly,
  showCharged,
  StreamMetering,
  usageOf,
  utf8Bytes,
  withoutUsage,
  type Closing,
} from "./metering.js";
import { OutputTally } from "./output-tally.js";
import type { UpstreamFlow, UpstreamReply } from "./ports.js";
import { consumerStopped } from "./sink.js";
import type { AnswerController, AnswerSink } from "./types.js";

/**
 * One admitted request through its provider (failing over before the first byte where routing
 * may), its answer metered event by event as the provider's body pushes them (no promise,
 * generator or iterator result per event), handed to `out` (the sink contract, types.ts), and
 * its one close: a {@link ChatCall}, one object per request.
 */

const encoder = new TextEncoder();

/** Serves one admitted request (a {@link ChatCall}); settles once its close is recorded. */
export function serve(ctx: RelayContext, admission: Admission, out: AnswerSink): Promise<void> {
  return new ChatCall(ctx, admission, out).serve();
}

/**
 * One request's call: its admission, its state (the offer serving it and its maximum, the
 * answer's tally, what was delivered and provided, the timings, and its close, decided and
 * recorded exactly once: a {@link CallState}). The stages are its methods; the callbacks it
 * hands out are bound once, here.
 */
export class ChatCall implements AnswerController {
  private readonly state: CallState;
  /** Aborts the provider's call: the client left, or the consumer stopped. */
  private readonly upstreamCall = new AbortController();
  /** The consumer is full (`pause`): the provider's body waits for `resume`. */
  private paused = false;
  /** The consumer stopped for good (`abort`), and why. */
  private consumerGone: { reason: unknown } | undefined = undefined;
  /** What ended the request before it was decided, for its record's error text. */
  private failedWith: unknown = undefined;
  /**
   * The gateway closed the request while it was served (its `streaming` mark found it no
   * longer open): a failed write leaves it pending, which closes the same way.
   */
  private lost = false;
  /** An event of the stream was JSON: without one the provider answered nothing readable. */
  private readable = false;
  /** The error the answer ended with when it was lost: not the provider's failure. */
  private lostError: GatewayError | undefined = undefined;
  /**
   * The provider's usage chunk (`stream_options.include_usage`), held back until the close:
   * then relayed with what was charged.
   */
  private usageChunk: { readonly data: string; readonly chunk: object } | undefined = undefined;
  /** The provider's streamed answer, pushed to {@link relay}. */
  private flow: UpstreamFlow | undefined = undefined;
  /** The relay stopped the flow (`[DONE]`, every choice at its limit): nothing more is relayed. */
  private stopped = false;
  /**
   * Events pushed while a chunk is counted off the event loop (the tally's promise,
   * {@link OutputTally.addChunk}): the flow is paused, but the rest of the body's read still
   * comes. Relayed in order after that chunk ({@link hold}).
   */
  private held: string[] | undefined = undefined;
  /** Settles once the held events are relayed (the close waits for it), and how that failed. */
  private holding: Promise<void> | undefined = undefined;
  private heldFailure: unknown = undefined;
  /** The stream failed: a chunk still being counted is not relayed. */
  private failing = false;
  // Bound once: the callbacks handed to the signal, the timers, the body and the sink.
  private readonly onClientAbort: () => void;
  private readonly relayEvent: (data: string) => boolean;
  private readonly markedOpen: (open: boolean) => void;

  constructor(
    ctx: RelayContext,
    private readonly admission: Admission,
    private readonly out: AnswerSink,
  ) {
    this.state = new CallState(ctx, admission);
    this.onClientAbort = this.clientAborted.bind(this);
    this.relayEvent = this.relay.bind(this);
    this.markedOpen = this.marked.bind(this);
  }

  async serve(): Promise<void> {
    const { req, input, requestId, quoteId } = this.admission;
    const { signal } = input;
    if (signal.aborted) this.onClientAbort();
    else signal.addEventListener("abort", this.onClientAbort, { once: true });
    try {
      // 5. Call the provider; before the first byte a connection error or a 5xx may fail over.
      const reply = await dispatch(this.state, this.admission, this.upstreamCall.signal);
      const { offer, outputLimit } = this.state.current;
      // A dialect's client is handed what its translator reads: the rest is not counted.
      const { dialect } = this.admission.input;
      this.state.tally = new OutputTally(
        this.admission.counter,
        outputLimit,
        req.choices,
        dialect === undefined ? undefined : dialects[dialect].reader(req.stream),
      );
      await this.out.started(
        {
          type: "started",
          requestId,
          quoteId,
          offerId: offer.offerId,
          tariffVersion: offer.tariff.version,
          maximumCredits: this.state.maximumCredits,
          stream: req.stream,
          replayed: false,
        },
        this,
      );
      // 6. Relay and meter.
      if (req.stream) await this.answerStream(reply);
      else await this.answerJson(reply);
    } catch (error) {
      this.failedWith = error;
      throw error;
    } finally {
      signal.removeEventListener("abort", this.onClientAbort);
      const { observer, current, lifecycle } = this.state;
      if (observer !== undefined && this.state.repliedAt !== undefined) {
        const seconds = ((this.state.endedAt ?? performance.now()) - this.state.repliedAt) / 1000;
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
        await this.state.tally?.settle();
        await this.state
          .closeAs(
            signal.aborted || this.consumerGone !== undefined || this.state.delivered > 0n
              ? this.state.cancelled()
              : {
                  kind: "failed",
                  reason: failedWith instanceof GatewayError ? failedWith.message : undefined,
                },
          )
          .catch(ignore);
        this.upstreamCall.abort(consumerStopped);
      }
    }
  }

  /** A JSON answer: read whole, cut at the priced limit, closed, handed on, recorded. */
  private async answerJson(reply: UpstreamReply): Promise<void> {
    const { observer, current, lifecycle } = this.state;
    const tally = this.state.tally!;
    let text: string;
    try {
      text = await reply.text();
      this.state.endedAt = performance.now();
      observer?.firstToken(
        current.offer.modelId,
        current.offer.offerId,
        (this.state.endedAt - this.state.calledAt) / 1000,
      );
    } catch (error) {
      if (this.admission.input.signal.aborted || this.consumerGone !== undefined) throw error;
      this.state.providerFailed();
      await this.state.closeAs({ kind: "unreadable" });
      throw error;
    }
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      this.state.providerFailed();
      await this.state.closeAs({ kind: "invalid_json" });
      throw new GatewayError("upstream_error", "the provider answered invalid JSON");
    }
    const provided = usageOf(body);
    // Output past the priced limit is cut (long pieces counted off the event loop); gateway
    // members are the gateway's to write.
    let cut = tally.addAnswer(body);
    if (typeof cut !== "boolean") cut = await cut;
    await tally.settle();
    this.throwIfConsumerGone();
    const spoke = dropGatewayMembers(body);
    const judgment = this.state.judge(provided);
    const final = this.state.close({ kind: "completed", judgment });
    this.state.compared(final, judgment.diverged);
    const { usage } = final;
    // The usage the client's SDK reads is what was charged; the claim is on the record.
    const shown = showCharged(body, usage);
    // Counted, not timed: a JSON answer shows no first token, and its whole time (which a
    // client sets with its output limit) is neither a time to first token nor a stream's pace.
    this.state.served();
    lifecycle.answered(final);
    this.out.chunk(
      {
        type: "chunk",
        data: encoder.encode(cut || spoke || shown ? JSON.stringify(body) : text),
        metering: { ...usage, credits: final.charge },
      },
      body,
    );
    await this.out.completed(this.state.completedEvent(usage, final, judgment));
    await lifecycle.record(final, completionRetries);
  }

  /** A streamed answer: its events pushed through {@link relay}, then closed and recorded. */
  private async answerStream(reply: UpstreamReply): Promise<void> {
    const { lifecycle } = this.state;
    const { input } = this.admission;
    // A failed write leaves the request pending, which closes the same way: only a definite
    // "no longer open" stops the answer.
    lifecycle.before = this.state.deps.ledger
      .markStreaming(this.admission.requestId)
      .then(this.markedOpen, ignore);
    try {
      this.flow = reply.stream(this.relayEvent);
      await this.flow.done;
      // Events held past the body's end (a chunk counted off the event loop) are relayed first.
      while (this.holding !== undefined) await this.holding;
      if (this.heldFailure !== undefined) throw this.heldFailure;
      this.state.endedAt = performance.now();
    } catch (error) {
      this.state.endedAt = performance.now();
      this.failing = true;
      await this.state.tally!.settle();
      // The consumer stopped reading: closed below as a client that left (the finally).
      if (this.consumerGone !== undefined) throw error;
      // A stream the provider broke off; not one the client left or the gateway lost.
      if (!input.signal.aborted && error !== this.lostError) this.state.providerFailed();
      await this.state.closeAs(
        input.signal.aborted
          ? this.state.cancelled()
          : { kind: "provider_failed", delivered: this.state.deliveredTokens() },
      );
      throw error instanceof GatewayError
        ? error
        : new GatewayError("upstream_error", "the provider failed mid-stream");
    }
    await lifecycle.before;
    if (this.lost) {
      // Never report a charge the record does not hold: the orphan rule closed it void.
      await this.state.closeAs({ kind: "orphaned", delivered: this.state.deliveredTokens() });
      throw this.lostRequest();
    }
    // The close counts on the event loop what is left to count: long pieces are counted first.
    await this.state.tally!.settle();
    this.throwIfConsumerGone();
    const judgment = this.state.judge(this.state.provided);
    const final = this.state.close({ kind: "completed", judgment, readable: this.readable });
    this.state.compared(final, judgment.diverged);
    const { usage } = final;
    const { firstTokenAt, endedAt } = this.state;
    this.state.served(
      firstTokenAt === undefined || endedAt === undefined
        ? undefined
        : {
            outputTokens: usage.outputTokens,
            latencyMs: firstTokenAt - this.state.calledAt,
            generationMs: endedAt - firstTokenAt,
          },
    );
    lifecycle.answered(final);
    if (this.admission.req.includeUsage) this.showUsage(final);
    const completed = this.state.completedEvent(usage, final, judgment);
    if (this.admission.receipt !== undefined) {
      // Paid with x402: the answer ends with the signed receipt of its recorded close.
      await this.out.completed({ ...completed, receipt: await this.state.recordForReceipt(final) });
      return;
    }
    await this.out.completed(completed);
    await lifecycle.record(final, completionRetries);
  }

  /**
   * The provider's usage chunk (`stream_options.include_usage`), where it came (last before
   * the gateway's own), showing what was charged: as it came when it already does (an honest
   * claim charged as claimed), else with the charge as its usage (its claim is on the record
   * and in `x_gateway`).
   */
  private showUsage(final: Closing): void {
    const held = this.usageChunk;
    if (held === undefined) return;
    const chunk = { ...held.chunk };
    const data = showCharged(chunk, final.usage) ? JSON.stringify(chunk) : held.data;
    this.out.chunk(
      {
        type: "chunk",
        data: utf8Bytes(data),
        metering: { ...final.usage, credits: final.charge },
      },
      chunk,
    );
  }

  /**
   * One provider event, pushed inside the body's read: metered, cut and handed on (the sink
   * contract: no await, never a promise). False holds the provider's body.
   */
  private relay(data: string): boolean {
    if (this.held !== undefined) {
      this.held.push(data);
      return false;
    }
    if (this.stopped || this.consumerGone !== undefined) return false;
    if (data === "[DONE]") {
      this.stop();
      return false;
    }
    let chunk: unknown;
    try {
      chunk = JSON.parse(data);
      this.readable = true;
      if (ownsGatewayMember(chunk)) return true;
    } catch {
      if (mimicsGatewayFraming(data)) return true;
      chunk = undefined;
    }
    const usage = usageOf(chunk);
    if (usage !== undefined) this.state.provided = usage;
    if (this.lost) throw this.lostRequest();
    // The provider's usage is its claim: held, and shown with the charge at the close.
    if (isUsageOnly(chunk)) {
      if (this.admission.req.includeUsage) this.usageChunk = { data, chunk: chunk as object };
      return true;
    }
    // Counted as it passes, and cut at the priced limit (then relayed as rewritten).
    const relayed = chunk === undefined ? undefined : this.state.tally!.addChunk(chunk);
    // A long piece is counted off the event loop: the body waits, this chunk is relayed then.
    if (relayed instanceof Promise) {
      this.hold(relayed, chunk, data);
      return false;
    }
    return this.pass(chunk, relayed, data);
  }

  /**
   * Relays a chunk as the tally left it (`relayed`; `chunk`: as parsed). False holds the body:
   * the relay stopped, or the consumer paused (inside this chunk or before it).
   */
  private pass(chunk: unknown, relayed: unknown, data: string): boolean {
    if (chunk !== undefined && relayed === undefined) return true;
    if (hasUsage(relayed)) relayed = withoutUsage(relayed);
    const { offer } = this.state.current;
    const pieces = deltaTextChoices(relayed);
    if (pieces > 0n) {
      const first = this.state.delivered === 0n;
      this.state.delivered += pieces;
      if (first) {
        this.admission.trace?.step("first_token");
        this.state.firstTokenAt = performance.now();
        const at = (this.state.firstTokenAt - this.state.calledAt) / 1000;
        this.state.observer?.firstToken(offer.modelId, offer.offerId, at);
      }
    }
    this.out.chunk(
      {
        type: "chunk",
        data: utf8Bytes(relayed === chunk ? data : JSON.stringify(relayed)),
        metering: new StreamMetering(
          offer.tariff,
          this.state.maximumCredits,
          this.state.inputBound,
          this.state.delivered,
        ),
      },
      relayed,
    );
    // Every choice reached the priced limit: the answer ends here, whatever the provider
    // would send on (its usage claim included; the count stands).
    if (this.state.tally!.done) {
      this.stop();
      return false;
    }
    // The consumer is full: the provider's body waits until it resumes.
    return !this.paused;
  }

  /**
   * The paused body's events wait while `counted` (a chunk's tally) is counted off the event
   * loop; then that chunk is relayed, and the events held meanwhile in order (one may be held
   * again), and the body resumes unless the consumer is paused (its `resume` does it) or the relay
   * stopped it. A failure fails the flow (the close sees it also when the body had ended).
   */
  private hold(counted: Promise<unknown>, chunk: unknown, data: string): void {
    const held: string[] = (this.held = []);
    this.holding = counted
      .then((relayed) => {
        this.held = undefined;
        if (this.failing) {
          this.holding = undefined;
          return;
        }
        this.pass(chunk, relayed, data);
        for (let i = 0; i < held.length; i += 1) {
          if (this.held !== undefined) {
            // Held again: the rest waits behind that chunk.
            (this.held as string[]).push(...held.slice(i));
            return;
          }
          this.relay(held[i]!);
        }
        if (this.held === undefined) {
          this.holding = undefined;
          if (!this.paused && !this.stopped) this.flow?.resume();
        }
      })
      .catch((error: unknown) => {
        this.held = undefined;
        this.holding = undefined;
        this.heldFailure = error;
        this.flow?.fail(error);
      });
  }

  private stop(): void {
    this.stopped = true;
    this.flow?.stop();
  }

  /** {@link AnswerController.pause}: the relay holds the body at the next event it pushes. */
  pause(): void {
    this.paused = true;
  }

  /** {@link AnswerController.resume}: reads on unless a chunk is being counted or it stopped. */
  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    if (this.held === undefined && !this.stopped) this.flow?.resume();
  }

  /**
   * The consumer aborted while the answer was read or counted: nothing more is handed on (the
   * finally closes the request as a client that left), whether or not the provider's body
   * honoured the abort.
   */
  private throwIfConsumerGone(): void {
    if (this.consumerGone !== undefined) throw this.consumerGone.reason;
  }

  /** {@link AnswerController.abort}: the provider's call ends; the request closes as left. */
  abort(reason: unknown): void {
    if (this.consumerGone !== undefined) return;
    this.consumerGone = { reason };
    this.flow?.fail(reason);
    this.upstreamCall.abort(reason);
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
    this.upstreamCall.abort(this.admission.input.signal.reason);
  }
}

function ignore(): undefined {
  return undefined;
}
