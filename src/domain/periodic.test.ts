import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { createPeriodic } from "./periodic.js";

/** A round the test ends when it wants: `release()` ends the latest one. */
function heldRounds() {
  let started = 0;
  let release: (() => void) | undefined;
  return {
    get started() {
      return started;
    },
    release: () => release?.(),
    run: () => {
      started++;
      return new Promise<void>((resolve) => (release = resolve));
    },
  };
}

async function until(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !condition(); i++) await sleep(2);
  expect(condition()).toBe(true);
}

describe("createPeriodic", () => {
  it("stop() resolves only once the round under way has ended", async () => {
    const rounds = heldRounds();
    const periodic = createPeriodic({ run: rounds.run, intervalMs: 5 });
    periodic.start();
    await until(() => rounds.started === 1);
    let stopped = false;
    const stopping = periodic.stop().then(() => (stopped = true));
    await sleep(20);
    expect(stopped).toBe(false);
    rounds.release();
    await stopping;
    expect(stopped).toBe(true);
  });

  it("starts no round after stop(), whether it came between rounds or during one", async () => {
    const between = heldRounds();
    const idle = createPeriodic({ run: between.run, intervalMs: 5 });
    idle.start();
    await idle.stop();
    await sleep(30);
    expect(between.started).toBe(0);

    const during = heldRounds();
    const busy = createPeriodic({ run: during.run, intervalMs: 5 });
    busy.start();
    await until(() => during.started === 1);
    const stopping = busy.stop();
    during.release();
    await stopping;
    await sleep(30);
    expect(during.started).toBe(1);
  });

  it("tells a failed round to onError and goes on with the next", async () => {
    const errors: unknown[] = [];
    let runs = 0;
    const failure = new Error("database down");
    const periodic = createPeriodic({
      run: async () => {
        runs++;
        if (runs === 1) throw failure;
      },
      intervalMs: 5,
      onError: (error) => errors.push(error),
    });
    periodic.start();
    await until(() => runs >= 3);
    await periodic.stop();
    expect(errors).toEqual([failure]);
  });

  it("runs the first round at start() when immediate, one interval after it otherwise", async () => {
    const now = heldRounds();
    const immediate = createPeriodic({ run: now.run, intervalMs: 60_000, immediate: true });
    immediate.start();
    expect(now.started).toBe(1);
    now.release();
    await immediate.stop();

    const later = heldRounds();
    const delayed = createPeriodic({ run: later.run, intervalMs: 60_000 });
    delayed.start();
    await sleep(20);
    expect(later.started).toBe(0);
    await delayed.stop();
  });

  it("a start() right after a stop() during a round goes on with one timer, not two", async () => {
    const rounds = heldRounds();
    const periodic = createPeriodic({ run: rounds.run, intervalMs: 5 });
    periodic.start();
    await until(() => rounds.started === 1);
    const stopping = periodic.stop();
    periodic.start();
    rounds.release();
    await stopping;
    await until(() => rounds.started === 2);
    // The second round is held: with two timers a third would start meanwhile.
    await sleep(30);
    expect(rounds.started).toBe(2);
    const last = periodic.stop();
    rounds.release();
    await last;
  });
});
