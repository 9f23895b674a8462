import { createHash } from "node:crypto";
import { GatewayError } from "../errors.js";
import type { ChatInput, IdempotencyStore, InferenceDeps } from "./ports.js";
import { ForwardingSink } from "./sink.js";
import {
  idempotencyLifetimeSeconds,
  type AnswerController,
  type AnswerSink,
  type ChatChunk,
  type ChatCompleted,
  type ChatEvent,
  type ChatStarted,
} from "./types.js";

/**
 * An Idempotency-Key's part in a chat call: its claim (or the stored answer it is replayed
 * from), the answer's events kept as they pass ({@link KeptAnswer}), and the result stored once
 * (the completed answer, or how an answer that began ended) or the key released.
 */

/** What keeping an answer needs of the pipeline. */
export interface Keeping {
  readonly deps: Pick<InferenceDeps, "idempotency" | "onIdempotencyResultLost">;
  /** IDEMPOTENCY_MAX_RESULT_BYTES. */
  readonly maxResultBytes: number;
}

function requestFingerprint(input: ChatInput): string {
  const hash = createHash("sha256")
    .update(input.body)
    .update("\0")
    .update(input.permitId ?? "")
    .update("\0")
    .update(input.quoteId ?? "");
  // A dialect's body is another request than the same bytes as a chat completion.
  if (input.dialect !== undefined) hash.update("\0").update(input.dialect);
  return hash.digest("hex");
}

/** Refuses a key that is not 1 to 255 visible ASCII characters (400). */
export function checkIdempotencyKey(key: string): void {
  if (key.length === 0 || key.length > 255 || !/^[\x21-\x7e]+$/.test(key)) {
    throw new GatewayError(
      "invalid_request",
      "Idempotency-Key must be 1 to 255 visible ASCII characters",
    );
  }
}

/**
 * Claims `key` for this request: undefined when it is this request's now, the stored answer's
 * events when one completed with it (to replay); 409 when it is in progress or was used with
 * another request.
 */
export async function claimKey(
  idempotency: IdempotencyStore,
  input: ChatInput,
  key: string,
  now: number,
): Promise<readonly ChatEvent[] | undefined> {
  const claim = await idempotency.claim({
    apiKeyId: input.apiKeyId,
    key,
    fingerprint: requestFingerprint(input),
    now,
    expiresAt: now + idempotencyLifetimeSeconds,
  });
  if (claim.state === "in_progress") {
    throw new GatewayError(
      "idempotency_in_progress",
      "a request with this Idempotency-Key is still in progress",
    );
  }
  if (claim.state === "mismatch") {
    throw new GatewayError(
      "idempotency_key_reused",
      "this Idempotency-Key was used with a different request",
    );
  }
  return claim.state === "completed" ? claim.events : undefined;
}

/** A stored answer, replayed into `out` as it was first handed out, at the pace `out` asks. */
export async function replay(events: readonly ChatEvent[], out: AnswerSink): Promise<void> {
  // An answer too large to keep: its error at once, before any answer begins.
  const last = events.at(-1);
  if (last?.type === "failed" && last.code === "idempotency_result_too_large")
    throw new GatewayError(last.code, last.message);
  const pace = new ReplayPace();
  for (const event of events) {
    if (event.type === "started") await out.started({ ...event, replayed: true }, pace);
    else if (event.type === "failed") throw new GatewayError(event.code, event.message);
    else if (event.type === "completed") await out.completed(event);
    else {
      out.chunk(event);
      if (pace.paused) await pace.resumed();
    }
    if (pace.stopped !== undefined) throw pace.stopped.reason;
  }
}

/** A replay's controller: the next stored event waits while its consumer is full. */
class ReplayPace implements AnswerController {
  paused = false;
  stopped: { reason: unknown } | undefined = undefined;
  private wake: (() => void) | undefined = undefined;
  pause(): void {
    this.paused = true;
  }
  resume(): void {
    this.paused = false;
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }
  abort(reason: unknown): void {
    this.stopped ??= { reason };
    this.resume();
  }
  resumed(): Promise<void> {
    return new Promise<void>((resolve) => (this.wake = resolve));
  }
}

/**
 * The answer's events on their way out (to `out`), kept for the key as they pass; and whether
 * the key is done with: its result stored (the completed answer, or how an answer that began
 * ended) or the key released. Once only: a stored completed result is never followed by a
 * failed one, whatever fails after it (the consumer stopping, the close's record throwing).
 */
export class KeptAnswer extends ForwardingSink {
  /** The events handed to the client so far. */
  private readonly events: ChatEvent[] = [];
  private began = false;
  private keyDone = false;
  /**
   * Chunk bytes kept for the key, and whether the answer outgrew IDEMPOTENCY_MAX_RESULT_BYTES:
   * then only its `started` event is kept (what the store needs), the answer goes on for its
   * client, and the result stored says it cannot be replayed (DESIGN.md 8: bounded memory).
   */
  private keptBytes = 0;
  private tooLarge = false;

  constructor(
    private readonly keeping: Keeping,
    private readonly input: ChatInput,
    private readonly key: string,
    /** The stream's admission (`acquireStream`): released once the answer is complete. */
    private readonly stream: { release?: () => void },
    out: AnswerSink,
  ) {
    super(out);
  }

  override async started(event: ChatStarted, controller: AnswerController): Promise<void> {
    // The claim names its request before the answer begins: should this process die after the
    // charge, with the result unstored, the key is not released (the orphan rule keeps the
    // claims of charged requests). Failing here, nothing began: the key is released and the
    // reservation voided.
    await this.keeping.deps.idempotency.begin({
      apiKeyId: this.input.apiKeyId,
      key: this.key,
      requestId: event.requestId,
    });
    this.began = true;
    this.keep(event);
    await this.next.started(event, controller);
  }

  override chunk(event: ChatChunk, parsed?: unknown): void {
    this.keep(event);
    this.next.chunk(event, parsed);
  }

  override async completed(event: ChatCompleted): Promise<void> {
    // The client has its whole answer: its stream no longer counts (the charge's record may
    // still be in flight).
    const { release } = this.stream;
    this.stream.release = undefined;
    release?.();
    // Stored before the last event is handed on: a consumer may stop reading right after it.
    if (!this.keyDone) {
      this.keyDone = true;
      await this.storeCompleted(this.tooLarge ? this.tooLargeResult() : [...this.events, event]);
    }
    await this.next.completed(event);
  }

  /**
   * An answer that ended without completing: nothing reached the client, and the key is free
   * for a corrected retry; or the answer began, and its outcome (any partial charge included)
   * is the key's for good.
   */
  async interrupted(error: unknown): Promise<void> {
    if (this.keyDone) return;
    this.keyDone = true;
    const { input, key } = this;
    if (!this.began) {
      await this.keeping.deps.idempotency.release({ apiKeyId: input.apiKeyId, key });
      return;
    }
    if (this.tooLarge) {
      await this.store(this.tooLargeResult());
      return;
    }
    const failure = error instanceof GatewayError ? error : undefined;
    await this.store([
      ...this.events,
      {
        type: "failed",
        code: failure?.code === "upstream_unavailable" ? "upstream_unavailable" : "upstream_error",
        message: failure?.message ?? "the answer was interrupted",
      },
    ]);
  }

  private keep(event: ChatEvent): void {
    if (this.keyDone) return;
    const { events } = this;
    if (event.type === "chunk" && !this.tooLarge) {
      this.keptBytes += event.data.byteLength;
      if (this.keptBytes > this.keeping.maxResultBytes) {
        this.tooLarge = true;
        events.length = Math.min(events.length, 1);
      }
    }
    if (!this.tooLarge) events.push(event);
  }

  private tooLargeResult(): ChatEvent[] {
    const { events } = this;
    const first = events[0];
    const requestId = first?.type === "started" ? first.requestId : "";
    return [
      ...events.slice(0, 1),
      {
        type: "failed",
        code: "idempotency_result_too_large",
        message: `the answer to this Idempotency-Key (request ${requestId}) was larger than ${this.keeping.maxResultBytes} bytes and was not kept, so it cannot be replayed; it was charged once (GET /v1/requests/${requestId})`,
      },
    ];
  }

  /**
   * Stores a completed answer's result for its key. A store that fails does not fail the
   * answer: it is complete and its charge is being recorded, so the client gets what it pays
   * for; only the replay is lost, which is reported (`onIdempotencyResultLost`). The key keeps
   * its claim: a retry is refused 409 `idempotency_in_progress`, never served and charged again.
   */
  private async storeCompleted(events: readonly ChatEvent[]): Promise<void> {
    try {
      await this.store(events);
    } catch (error) {
      const first = events[0];
      this.keeping.deps.onIdempotencyResultLost?.({
        requestId: first?.type === "started" ? first.requestId : "",
        error,
      });
    }
  }

  private async store(events: readonly ChatEvent[]): Promise<void> {
    const first = events[0];
    if (first?.type !== "started") return;
    await this.keeping.deps.idempotency.complete({
      apiKeyId: this.input.apiKeyId,
      key: this.key,
      requestId: first.requestId,
      events,
    });
  }
}
