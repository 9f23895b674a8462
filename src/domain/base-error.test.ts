import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { wireOf } from "../connect/error-codes.js";
import { GatewayError } from "./errors.js";
import { BaseError } from "./base-error.js";
import { ConfigError } from "../config.js";

const srcDir = fileURLToPath(new URL("..", import.meta.url));

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await sources(path)));
    else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".test.ts")) out.push(path);
  }
  return out;
}

describe("one base error class", () => {
  it("every error class of the product extends BaseError (only BaseError extends Error)", async () => {
    const offenders: string[] = [];
    for (const file of await sources(srcDir)) {
      const text = await readFile(file, "utf8");
      for (const match of text.matchAll(/class (\w+) extends Error\b/g))
        if (match[1] !== "BaseError") offenders.push(`${file}: ${match[1]}`);
    }
    expect(offenders).toEqual([]);
  });

  it("carries a reason code: a GatewayError's is its API code, shown on the wire by kind", () => {
    const error = new GatewayError("permit_expired", "the permit expired");
    expect(error).toBeInstanceOf(BaseError);
    expect(error.reason).toBe("permit_expired");
    expect(error.kind).toBe("payment");
    expect(wireOf(error.code)).toEqual({ status: 402, type: "payment_required", connect: 9 });
    const config = new ConfigError(["PORT must be a number"]);
    expect(config).toBeInstanceOf(BaseError);
    expect(config.reason).toBe("config_invalid");
  });

  it("no HTTP status is written in src/domain/errors.ts", async () => {
    const text = await readFile(join(srcDir, "domain", "errors.ts"), "utf8");
    expect(text.match(/\b(?:status|[1-5]\d\d)\b/gi) ?? []).toEqual([]);
  });
});
