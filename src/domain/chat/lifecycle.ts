import type { Hex } from "viem";
import type { Closing } from "./metering.js";
import type { InferenceDeps, ReserveInput } from "./ports.js";
import type { FinalizeInput } from "./types.js";

/**
 * The lifecycle of a request's close: admitted (reserved) -> sent -> streaming -> closing ->
 * closed. Every request ends in exactly one durable close; a close the ledger refuses waits in
 * an outbox that housekeeping writes until the ledger takes it (docs/decisions/chat-quotes-and-money.md).
 */

/** A close the ledger has not taken yet, kept until it does. */
export interface PendingClose {
  readonly finalize: FinalizeInput;
  readonly flag: { readonly offerId: Hex; readonly reason: string } | undefined;
  /**
   * The reservation, when this is the void close of one whose outcome is unknown: it is
   * written by `voidReservation`, which also covers a reservation that lands after it.
   */
  readonly reservation?: ReserveInput;
}

/**
 * Attempts after the first for recording a completed answer's charge at once (about 0.7 s);
 * after them the close waits in the outbox for housekeeping, as every refused close does.
 */
export const completionRetries = 3;

export async function withRetries<T>(retries: number, attempt: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await attempt();
    } catch (error) {
      if (i >= retries) throw error;
      await new Promise((resolve) => setTimeout(resolve, Math.min(100 * 2 ** i, 8_000)));
    }
  }
}

/**
 * The closes of this process's requests: written once each, and those the ledger refuses kept
 * in an outbox until housekeeping writes them (`retry`).
 */
export interface Closes {
  /** Writes a close and its offer flag; the close is exactly-once, so a retry never charges twice. */
  write(close: PendingClose): Promise<{ creditsCharged: bigint }>;
  /** Keeps a close the ledger refused, for {@link retry}. */
  enqueue(close: PendingClose): void;
  retry(): Promise<{ written: number; pending: number }>;
  /** Marks a completed answer whose close is about to be written (record reads wait for it). */
  recording(requestId: string): () => void;
  whenRecorded(requestId: string): Promise<void>;
  /** Settles once the closes being recorded now are (not those recorded later). */
  whenAllRecorded(): Promise<void>;
  /** Waits for closes being written, then tries the outbox a few times (graceful shutdown). */
  drain(): Promise<void>;
}

export function createCloses(deps: Pick<InferenceDeps, "ledger" | "clock">): Closes {
  const outbox = new Map<Hex, PendingClose>();
  // Completed answers whose final state is being recorded, by request id.
  const recording = new Map<string, Promise<void>>();
  const write = async (close: PendingClose): Promise<{ creditsCharged: bigint }> => {
    const result =
      close.reservation !== undefined && deps.ledger.voidReservation !== undefined
        ? await deps.ledger.voidReservation(close.reservation, close.finalize)
        : await deps.ledger.finalize(close.finalize);
    if (close.flag !== undefined) {
      await deps.ledger.recordOfferFlag({
        ...close.flag,
        requestId: close.finalize.requestId,
        now: deps.clock(),
      });
    }
    return result;
  };
  const retry = async (): Promise<{ written: number; pending: number }> => {
    let written = 0;
    for (const [requestId, close] of [...outbox]) {
      try {
        await write(close);
        outbox.delete(requestId);
        written++;
      } catch {
        // Still refused: the next round tries again.
      }
    }
    return { written, pending: outbox.size };
  };
  return {
    write,
    enqueue: (close) => void outbox.set(close.finalize.requestId, close),
    retry,
    recording(requestId) {
      let done = () => {};
      recording.set(requestId, new Promise<void>((resolve) => (done = resolve)));
      return () => {
        recording.delete(requestId);
        done();
      };
    },
    whenRecorded: (requestId) => recording.get(requestId) ?? Promise.resolve(),
    whenAllRecorded: async () => void (await Promise.all([...recording.values()])),
    async drain() {
      while (recording.size > 0) await Promise.all(recording.values());
      for (let round = 0; outbox.size > 0 && round < 5; round++) {
        if ((await retry()).pending > 0) await new Promise((r) => setTimeout(r, 500));
      }
    },
  };
}

/**
 * One request's close: decided once (`decided`), in memory first (a completed answer goes to
 * the client before its write), then written through {@link Closes}, or kept in the outbox.
 * `before` is what must land first (the request's `streaming` mark, set once it is sent).
 */
export class RequestClose {
  /** What must land before the close is written (the request's `streaming` mark). */
  before: Promise<unknown> | undefined = undefined;
  private isDecided = false;
  private answer: Closing | undefined = undefined;
  private recorded: (() => void) | undefined = undefined;

  constructor(
    private readonly closes: Closes,
    private readonly requestId: Hex,
    private readonly clock: () => number,
  ) {}

  /** A close was decided (written, being written, or in the outbox). */
  get decided(): boolean {
    return this.isDecided;
  }

  /** A completed answer reported to the client whose close is not written yet. */
  get pending(): Closing | undefined {
    return this.answer;
  }

  /** The answer is complete and reported: its close is recorded next (or by the finally). */
  answered(c: Closing): void {
    this.answer = c;
    this.recorded = this.closes.recording(this.requestId);
  }

  /**
   * Makes a closing durable: the reservation becomes its charge, exactly once. Answers the
   * charge, the close as written (`now` is the record's `completed_at`) and whether the ledger
   * took it now (`written`; false: it waits in the outbox, written later as it is).
   */
  async record(
    c: Closing,
    retries = 0,
  ): Promise<{ creditsCharged: bigint; close: FinalizeInput; written: boolean }> {
    this.isDecided = true;
    this.answer = undefined;
    const close: PendingClose = {
      finalize: {
        requestId: this.requestId,
        status: c.status,
        inputTokens: c.usage.inputTokens,
        outputTokens: c.usage.outputTokens,
        cachedInputTokens: c.usage.cachedInputTokens ?? 0n,
        reasoningTokens: c.usage.reasoningTokens ?? 0n,
        creditsCharged: c.charge,
        billing: c.billing,
        usageSource: c.usageSource,
        ...(c.claimed === undefined ? {} : { claimed: c.claimed }),
        ...(c.counted === undefined ? {} : { counted: c.counted }),
        ...(c.error === undefined ? {} : { error: c.error }),
        now: this.clock(),
      },
      flag: c.aboveQuote ? { offerId: c.offerId, reason: "usage_above_quote" } : undefined,
    };
    try {
      await this.before;
      const { creditsCharged } = await withRetries(retries, () => this.closes.write(close));
      return { creditsCharged, close: close.finalize, written: true };
    } catch {
      this.closes.enqueue(close);
      return { creditsCharged: c.charge, close: close.finalize, written: false };
    } finally {
      this.recorded?.();
      this.recorded = undefined;
    }
  }
}
