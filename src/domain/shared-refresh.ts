/**
 * A value read at most once per `maxAgeMs`, however many ask for it: callers while a read is
 * under way share it, callers within `maxAgeMs` of its start get its result, and only the first
 * caller after that starts the next read. This is how routes anyone may call without a key
 * (`/ready`, `/metrics`) answer from state instead of reaching the database or the chain on
 * every request (DESIGN.md section 8, "Unauthenticated routes cost nothing"): a flood of them
 * costs one read per source per `maxAgeMs`.
 *
 * A rejected read is kept like a value (answered until it is `maxAgeMs` old): retrying at once
 * would let the same flood reach a failing source on every request. `load` must settle in
 * bounded time (give it a timeout): until it does, every caller waits on it.
 */
export interface SharedRefresh<T> {
  /** The latest read, started now if none is under way and the last began `maxAgeMs` ago. */
  get(): Promise<T>;
}

export interface SharedRefreshOptions {
  readonly maxAgeMs: number;
  /** Milliseconds on a monotonic clock; default `performance.now`. */
  readonly now?: () => number;
}

export function createSharedRefresh<T>(
  load: () => Promise<T>,
  opts: SharedRefreshOptions,
): SharedRefresh<T> {
  const now = opts.now ?? (() => performance.now());
  let current: { readonly startedAt: number; readonly result: Promise<T> } | undefined;
  let settled = true;
  return {
    get() {
      const at = now();
      if (current !== undefined && (!settled || at - current.startedAt < opts.maxAgeMs)) {
        return current.result;
      }
      settled = false;
      // Started synchronously, so callers in the same tick already share it.
      const result = Promise.resolve()
        .then(load)
        .finally(() => {
          settled = true;
        });
      // Callers may all have gone; the kept promise must not count as unhandled.
      result.catch(() => undefined);
      current = { startedAt: at, result };
      return result;
    },
  };
}
