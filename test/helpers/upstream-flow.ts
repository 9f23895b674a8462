import type { UpstreamFlow } from "../../src/domain/chat/ports.js";

/**
 * A fake provider's events (an async iterable, as a test writes them) pushed to a reader the
 * way the upstream adapter pushes a real body (`UpstreamReply.stream`): in order, pausing while
 * the reader returned false until `resume`, nothing after `stop` or `fail`, and `done` settling
 * as the adapter's does (what the iterable or the reader threw rejects it).
 */
export function flowFromEvents(
  events: AsyncIterable<string>,
  into: (data: string) => boolean,
): UpstreamFlow {
  let over = false;
  let failure: { error: unknown } | undefined;
  let wake: (() => void) | undefined;
  let paused = false;
  const iterator = events[Symbol.asyncIterator]();
  const stopWaiting = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const done = (async () => {
    try {
      for (;;) {
        if (paused && !over) await new Promise<void>((resolve) => (wake = resolve));
        if (over) break;
        const next = await iterator.next();
        if (over || next.done === true) break;
        if (!into(next.value)) paused = true;
      }
    } finally {
      over = true;
      await iterator.return?.();
    }
    if (failure !== undefined) throw failure.error;
  })();
  return {
    done,
    resume: () => {
      paused = false;
      stopWaiting();
    },
    stop: () => {
      over = true;
      stopWaiting();
    },
    fail: (error) => {
      failure ??= { error };
      over = true;
      stopWaiting();
    },
  };
}
