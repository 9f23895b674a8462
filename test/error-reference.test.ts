import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { wireOf } from "../src/connect/error-codes.js";
import { errorCodes, type ErrorCode } from "../src/domain/errors.js";

/**
 * The errors page's table of every code (docs/decisions/errors-and-rate-limits.md, "Every code")
 * is the one place an app developer reads a code's status and type: it must list exactly the
 * codes the gateway answers with, each with the wire form it has, and name a page that explains
 * it.
 */
const page = "docs/decisions/errors-and-rate-limits.md";
const text = readFileSync(page, "utf8");

interface Row {
  readonly code: string;
  readonly status: number;
  readonly type: string;
  readonly grpc: string;
  readonly where: string;
}

/** The table's section, and the page without it. */
function split(body: string): { table: string; rest: string } {
  const start = body.indexOf("## Every code");
  if (start === -1) return { table: "", rest: body };
  const end = body.indexOf("\n## ", start + 1);
  const stop = end === -1 ? body.length : end;
  return { table: body.slice(start, stop), rest: body.slice(0, start) + body.slice(stop) };
}

function rows(): Row[] {
  return split(text)
    .table.split("\n")
    .filter((line) => /^\| `[a-z0-9_]+` *\|/.test(line))
    .map((line) => {
      const [code, status, type, grpc, where] = line
        .split("|")
        .slice(1, -1)
        .map((cell) => cell.trim());
      return {
        code: code!.replaceAll("`", ""),
        status: Number(status),
        type: type!,
        grpc: grpc!,
        where: where!,
      };
    });
}

/** `InvalidArgument` as gRPC writes it: `invalid_argument`. */
const grpcName = (code: Code) => Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();

describe("the error reference (every code, its status, type and gRPC code)", () => {
  it("lists every code of errorCodes once, in order, with the wire form the gateway answers with", () => {
    const codes = Object.keys(errorCodes) as ErrorCode[];
    expect(rows().map((r) => r.code)).toEqual(codes);
    for (const row of rows()) {
      const wire = wireOf(row.code as ErrorCode);
      expect({ code: row.code, status: row.status, type: row.type, grpc: row.grpc }).toEqual({
        code: row.code,
        status: wire.status,
        type: wire.type,
        grpc: grpcName(wire.connect),
      });
    }
  });

  it("names, for each code, DESIGN.md section 5 or a page of the docs that explains it", () => {
    for (const row of rows()) {
      if (row.where === "DESIGN.md §5") continue;
      const link = /^\[[^\]]+\]\(([^)]+)\)$/.exec(row.where);
      expect(link, `${row.code}: ${row.where}`).not.toBeNull();
      const target = join(dirname(page), link![1]!);
      const body = readFileSync(target, "utf8");
      // Outside this table: the errors page names its own codes in its other sections.
      expect(split(body).rest.includes(`\`${row.code}\``), `${row.code} in ${target}`).toBe(true);
    }
  });
});
