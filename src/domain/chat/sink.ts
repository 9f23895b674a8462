export type { AnswerSink, ChatSink } from "./types.js";

/** The sink contract (how a chat call hands its answer to a transport) is in types.ts, `ChatSink`. */

/**
 * What a sink's `drained` rejects with when its consumer stopped reading before the answer's
 * end (the RPC's caller stopped iterating), and what the provider call is aborted with then:
 * one object, built once (an AbortError per call would build a stack trace). Never mutated.
 */
export const consumerStopped = new DOMException("the answer's consumer stopped", "AbortError");
