/**
 * A round run in the background every `intervalMs`, one at a time: the next is timed from the
 * end of the last, so a slow round (a database that takes its time) never overlaps the next.
 * This is how every process reads what the fleet shares (offer cooldowns, audit standings,
 * measurements) and probes endpoints; routing then answers from memory.
 */
export interface Periodic {
  /** Starts the rounds; a second call does nothing. */
  start(): void;
  /** No round starts after this; resolves once the round under way (if any) has ended. */
  stop(): Promise<void>;
}

/**
 * A failed round is told to `onError` and the rounds go on. The timer is unref'd: rounds alone
 * do not keep the process alive. `immediate`: the first round at `start()` (default: one
 * `intervalMs` after it).
 */
export function createPeriodic(deps: {
  readonly run: () => Promise<void>;
  readonly intervalMs: number;
  readonly onError?: (error: unknown) => void;
  readonly immediate?: boolean;
}): Periodic {
  let started = false;
  let timer: NodeJS.Timeout | undefined;
  let round: Promise<void> | undefined;
  const schedule = () => {
    timer = setTimeout(loop, deps.intervalMs);
    timer.unref();
  };
  // Async so that a `run` that throws before its first await is reported like any other failure.
  const runRound = async () => {
    try {
      await deps.run();
    } catch (error) {
      deps.onError?.(error);
    }
  };
  const loop = () => {
    timer = undefined;
    round = runRound().finally(() => {
      round = undefined;
      if (started) schedule();
    });
  };
  return {
    start() {
      if (started) return;
      started = true;
      // A round still ending after a stop() schedules the next one itself.
      if (round !== undefined) return;
      if (deps.immediate === true) loop();
      else schedule();
    },
    async stop() {
      started = false;
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
      await round;
    },
  };
}
