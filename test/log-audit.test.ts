import { afterEach, describe, expect, it } from "vitest";
import { auditLog, auditSecret, auditSize, findLeaks, resetAudit } from "./helpers/log-audit.js";

// The audit every test file runs after its tests (test/setup/log-audit.ts) must find what it
// looks for; this file checks the finder itself and leaves the audit empty for its own run.
describe("log audit", () => {
  afterEach(() => resetAudit());

  it("finds a secret anywhere in a captured line and masks it in the report", () => {
    const apiKey = "gw_live_0123456789abcdef0123";
    auditSecret("api key", apiKey);
    auditLog(
      "gateway",
      '{"level":30,"msg":"ok"}\n{"level":50,"msg":"bad key gw_live_0123456789abcdef0123"}',
    );
    const leaks = findLeaks();
    expect(leaks).toEqual([
      { kind: "api key", source: "gateway", line: '{"level":50,"msg":"bad key <api key>"}' },
    ]);
    expect(auditSize()).toEqual({ lines: 2, secrets: 1 });
  });

  it("finds a hex secret without its 0x and in either case", () => {
    const key = `0x${"ab".repeat(32)}`;
    auditSecret("private key", key);
    auditLog("worker", `signing with ${"AB".repeat(32)}`);
    auditLog("worker", `signing with ${"ab".repeat(32)}`);
    expect(findLeaks().map((l) => l.kind)).toEqual(["private key", "private key"]);
  });

  it("ignores lines without secrets and values too short to tell apart", () => {
    auditSecret("endpoint token", "short");
    auditSecret("endpoint token", undefined);
    auditLog("gateway", "a short line that mentions short");
    expect(findLeaks()).toEqual([]);
    expect(auditSize().secrets).toBe(0);
  });
});

describe("log audit: what no line may show, handed out or not", () => {
  afterEach(() => resetAudit());

  it("finds anything shaped like an API key, a made-up one included (an x-api-key a client sent)", () => {
    const madeUp = `gw_${"Ab1".repeat(13)}X`;
    auditLog("gateway", `{"level":30,"msg":"refused ${madeUp}"}`);
    auditLog("gateway", `{"level":30,"instance":"gw_0123456789abcdef","msg":"ok"}`);
    expect(findLeaks()).toEqual([
      { kind: "api key", source: "gateway", line: '{"level":30,"msg":"refused <api key>"}' },
    ]);
  });

  it("finds a credential or private-key field left unredacted, at any depth", () => {
    auditLog(
      "gateway",
      JSON.stringify({
        level: 30,
        req: { headers: { "x-api-key": "k-123", authorization: "[redacted]" } },
        config: { receiptPrivateKey: "0x01" },
        apiKeyId: "key_1",
      }),
    );
    expect(findLeaks()).toEqual([
      { kind: "api key", source: "gateway", line: "req.headers.x-api-key not redacted" },
      { kind: "private key", source: "gateway", line: "config.receiptPrivateKey not redacted" },
    ]);
  });
});
