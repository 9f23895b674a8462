import type { AnswerController, ChatEvent, ChatSink } from "../domain/chat/index.js";
import { consumerStopped } from "../domain/chat/sink.js";

/**
 * Events queued before the call pauses the provider: one, and the provider resumes only when
 * the consumer asks for the next event, so the RPC's caller paces the answer as it pulls (at
 * most the rest of one provider read is metered past what it took, as on the REST path); a
 * consumer that stops early is charged for what it was handed.
 */
const highWater = 1;

/**
 * A chat call as an async generator of its events: the bridge the Connect, gRPC and gRPC-Web
 * callers of the server-streaming RPC pay for, the only transport that pulls (the REST facade
 * calls `chatInto` with its own sink and does not). `start` runs the call with its own signal
 * (the caller's `signal`, or the consumer stopping) and the bridge's sink. Events are queued as the call pushes them and yielded as the consumer
 * pulls; past {@link highWater} the call pauses the provider until the consumer catches up. A
 * consumer that stops iterating early aborts the call as a client that left (its signal's
 * reason: `consumerStopped`) and waits for its close. The call's failure is thrown after the
 * events before it.
 */
export async function* answerBridge(
  start: (signal: AbortSignal, sink: ChatSink) => Promise<void>,
  signal: AbortSignal,
): AsyncGenerator<ChatEvent, void, undefined> {
  const queue: ChatEvent[] = [];
  let head = 0;
  let wake: (() => void) | undefined;
  // The call's flow control (from `started`), and whether the bridge paused it.
  let controller: AnswerController | undefined;
  let paused = false;
  // The call's `completed` waits until the consumer asks for more (or stops), as a generator's
  // yield would: the charge is recorded after the consumer took the last event.
  let taken: (() => void) | undefined;
  let failure: { error: unknown } | undefined;
  let late: { error: unknown } | undefined;
  let over = false;
  let stopped = false;
  const goOn = (): void => {
    const t = taken;
    taken = undefined;
    t?.();
  };
  const notify = (): void => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const push = (event: ChatEvent): void => {
    queue.push(event);
    notify();
  };
  const sink: ChatSink = {
    started(event, control) {
      controller = control;
      push(event);
    },
    chunk(event) {
      if (stopped) return;
      push(event);
      if (!paused && queue.length - head >= highWater) {
        paused = true;
        controller?.pause();
      }
    },
    completed(event) {
      if (stopped) return;
      push(event);
      return new Promise<void>((resolve) => (taken = resolve));
    },
    failed(error) {
      failure ??= { error };
      notify();
    },
    cancelled(reason) {
      failure ??= { error: reason };
      notify();
    },
  };
  // The call's own signal: the caller's, or the consumer stopping.
  const own = new AbortController();
  const forward = (): void => own.abort(signal.reason);
  if (signal.aborted) forward();
  else signal.addEventListener("abort", forward, { once: true });
  const call = start(own.signal, sink).then(
    () => {
      over = true;
      notify();
    },
    (error: unknown) => {
      // A failure after the answer (recording its charge): the caller's stream ends with it.
      late = { error };
      over = true;
      notify();
    },
  );
  try {
    for (;;) {
      if (head < queue.length) {
        const event = queue[head++]!;
        if (head === queue.length) {
          queue.length = 0;
          head = 0;
        }
        yield event;
        continue;
      }
      if (failure !== undefined) throw failure.error;
      if (late !== undefined) throw late.error;
      if (over) return;
      // The consumer asks for more than was queued: the call goes on (pull pacing).
      if (paused) {
        paused = false;
        controller?.resume();
      }
      goOn();
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    signal.removeEventListener("abort", forward);
    if (!over) {
      // The consumer stopped before the call ended: it ends as a client that left (through
      // its controller once the answer began, its signal before).
      stopped = true;
      if (controller !== undefined) controller.abort(consumerStopped);
      else own.abort(consumerStopped);
      goOn();
      await call;
      // What failed after the answer (its charge's record) is the stopping consumer's to see,
      // from its return(), as it was when the call itself was the generator.
      // eslint-disable-next-line no-unsafe-finally
      if (late !== undefined) throw late.error;
    }
  }
}
