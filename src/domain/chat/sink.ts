import type {
  AnswerController,
  AnswerSink,
  ChatChunk,
  ChatCompleted,
  ChatStarted,
} from "./types.js";

/** The sink contract (how a chat call hands its answer to a transport) is in types.ts, `ChatSink`. */

/**
 * What a consumer that stopped reading before the answer's end (the RPC's caller stopped
 * iterating) aborts the call with (`AnswerController.abort`), and what the provider call is
 * aborted with then: one object, built once (an AbortError per call would build a stack
 * trace). Never mutated.
 */
export const consumerStopped = new DOMException("the answer's consumer stopped", "AbortError");

/**
 * A layer between a chat call and its transport: forwards every call to `next` as it came (the
 * controller included, so pacing crosses every layer untouched); a layer overrides what it
 * changes. One object per call; its methods are the prototype's.
 */
export class ForwardingSink<Next extends AnswerSink = AnswerSink> implements AnswerSink {
  constructor(protected readonly next: Next) {}
  started(event: ChatStarted, controller: AnswerController): void | Promise<void> {
    return this.next.started(event, controller);
  }
  chunk(event: ChatChunk, parsed?: unknown): void {
    this.next.chunk(event, parsed);
  }
  completed(event: ChatCompleted): void | Promise<void> {
    return this.next.completed(event);
  }
}
