import { describe, expect, it } from "vitest";
import { createSharedRefresh } from "./shared-refresh.js";

describe("createSharedRefresh", () => {
  it("shares one read among concurrent callers and reuses it until it is maxAgeMs old", async () => {
    let t = 0;
    let reads = 0;
    const refresh = createSharedRefresh(async () => ++reads, { maxAgeMs: 1000, now: () => t });
    expect(await Promise.all(Array.from({ length: 100 }, () => refresh.get()))).toEqual(
      Array.from({ length: 100 }, () => 1),
    );
    t = 999;
    expect(await refresh.get()).toBe(1);
    expect(reads).toBe(1);
    t = 1000;
    expect(await refresh.get()).toBe(2);
    t = 1500;
    expect(await refresh.get()).toBe(2);
    expect(reads).toBe(2);
  });

  it("never starts a second read while one is under way, however old it is", async () => {
    let t = 0;
    let reads = 0;
    let release: (() => void) | undefined;
    const refresh = createSharedRefresh(
      async () => {
        reads++;
        await new Promise<void>((resolve) => (release = resolve));
        return reads;
      },
      { maxAgeMs: 1000, now: () => t },
    );
    const first = refresh.get();
    t = 5000;
    const second = refresh.get();
    expect(second).toBe(first);
    await new Promise((resolve) => setImmediate(resolve));
    expect(release).toBeDefined();
    release?.();
    expect(await second).toBe(1);
    expect(reads).toBe(1);
  });

  it("keeps a failed read for maxAgeMs instead of retrying on every call", async () => {
    let t = 0;
    let reads = 0;
    const refresh = createSharedRefresh(
      async () => {
        reads++;
        if (reads === 1) throw new Error("source down");
        return "up";
      },
      { maxAgeMs: 1000, now: () => t },
    );
    await expect(refresh.get()).rejects.toThrow("source down");
    await expect(refresh.get()).rejects.toThrow("source down");
    expect(reads).toBe(1);
    t = 1000;
    expect(await refresh.get()).toBe("up");
    expect(reads).toBe(2);
  });
});
