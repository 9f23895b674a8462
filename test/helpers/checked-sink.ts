import { ForwardingSink } from "../../src/domain/chat/sink.js";
import type {
  AnswerController,
  ChatChunk,
  ChatCompleted,
  ChatSink,
  ChatStarted,
} from "../../src/domain/chat/index.js";

/**
 * A sink between a chat call and its consumer that checks the sink contract's order
 * (src/domain/chat/types.ts, `ChatSink`): `started` at most once and first, `chunk` only after
 * it, exactly one terminal call (`completed` only after `started`), nothing after the terminal
 * call, and neither `chunk` nor `completed` once the consumer aborted through the controller
 * (which it may use at any time after `started`: after the terminal call it changes nothing).
 * Every call is forwarded as it came; {@link check} throws what broke the contract.
 */
export class CheckedSink extends ForwardingSink<ChatSink> implements ChatSink {
  private state: "before" | "answering" | "ended" = "before";
  private aborted = false;
  private readonly calls: string[] = [];
  readonly violations: string[] = [];

  override started(event: ChatStarted, controller: AnswerController): void | Promise<void> {
    this.note("started", this.state === "before");
    this.state = "answering";
    return super.started(event, this.checkedController(controller));
  }

  override chunk(event: ChatChunk, parsed?: unknown): void {
    this.note("chunk", this.state === "answering" && !this.aborted);
    super.chunk(event, parsed);
  }

  override completed(event: ChatCompleted): void | Promise<void> {
    this.note("completed", this.state === "answering" && !this.aborted);
    this.state = "ended";
    return super.completed(event);
  }

  failed(error: unknown): void {
    this.note("failed", this.state !== "ended");
    this.state = "ended";
    this.next.failed(error);
  }

  cancelled(reason: unknown): void {
    this.note("cancelled", this.state !== "ended");
    this.state = "ended";
    this.next.cancelled(reason);
  }

  /** Throws when a call broke the order, or when the call ended with no terminal call. */
  check(): void {
    if (this.state !== "ended") this.violations.push(`no terminal call after ${this.trail()}`);
    if (this.violations.length > 0)
      throw new Error(`the sink contract was broken: ${this.violations.join("; ")}`);
  }

  private checkedController(controller: AnswerController): AnswerController {
    return {
      pause: () => controller.pause(),
      resume: () => controller.resume(),
      abort: (reason) => {
        if (this.state === "answering") {
          this.aborted = true;
          this.calls.push("abort");
        }
        controller.abort(reason);
      },
    };
  }

  private note(call: string, inOrder: boolean): void {
    if (!inOrder) this.violations.push(`${call} after ${this.trail()}`);
    // Repeated chunks are noted once per run, so a long answer's trail stays short.
    if (!(call === "chunk" && this.calls.at(-1) === "chunk")) this.calls.push(call);
  }

  private trail(): string {
    return this.calls.length === 0 ? "nothing" : this.calls.join(", ");
  }
}
