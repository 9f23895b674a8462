import { describe, expect, it } from "vitest";
import { usageRange } from "./activity.js";

describe("usageRange", () => {
  const now = 1_800_000_000;

  it("defaults to the 7 days up to now, this second and the next included (the database rounds)", () => {
    expect(usageRange("day", {}, now)).toEqual({ from: now + 2 - 7 * 86_400, to: now + 2 });
    expect(usageRange("hour", { to: now }, now)).toEqual({ from: now - 7 * 86_400, to: now });
    expect(usageRange("day", { from: 5 }, 10)).toEqual({ from: 5, to: 12 });
  });

  it("spans at most 93 days by day and 7 days by hour", () => {
    expect(usageRange("day", { from: 0, to: 93 * 86_400 }, now)).toEqual({
      from: 0,
      to: 93 * 86_400,
    });
    expect(() => usageRange("day", { from: 0, to: 93 * 86_400 + 1 }, now)).toThrow(
      expect.objectContaining({ code: "invalid_request" }),
    );
    expect(() => usageRange("hour", { from: 0, to: 7 * 86_400 + 1 }, now)).toThrow(
      expect.objectContaining({ code: "invalid_request" }),
    );
  });

  it("refuses an empty or inverted range", () => {
    for (const asked of [
      { from: 10, to: 10 },
      { from: 11, to: 10 },
      { from: -1, to: 10 },
    ])
      expect(() => usageRange("day", asked, now)).toThrow(
        expect.objectContaining({ code: "invalid_request" }),
      );
  });
});
