import { createPublicClient, http } from "viem";
import { describe, expect, it } from "vitest";
import { readTokenUnits } from "./token-units.js";

describe("readTokenUnits", () => {
  it("throws when the RPC fails (a failing node is not a token answering nothing)", async () => {
    // Port 9 (discard) refuses connections: the transport fails, the token was never asked.
    const client = createPublicClient({ transport: http("http://127.0.0.1:9", { retryCount: 0 }) });
    await expect(readTokenUnits(client, `0x${"11".repeat(20)}`)).rejects.toThrow();
  });
});
