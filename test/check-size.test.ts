import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { exceptions, measure, violations } from "../scripts/check-size.mjs";

/** The size limits `npm run check` holds (scripts/check-size.mjs, docs/architecture.md). */
describe("size limits", () => {
  const dir = mkdtempSync(join(tmpdir(), "gw-size-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const fn = (name: string, bodyLines: number) => [
    `export function ${name}() {`,
    ...Array.from({ length: bodyLines }, () => "  void 0;"),
    "}",
  ];

  it("names a file over 500 lines and a function over 150, and neither at the limits", () => {
    const src = join(dir, "src");
    mkdirSync(src, { recursive: true });
    // 500 lines with a function of exactly 150: within.
    writeFileSync(
      join(src, "fits.ts"),
      [...fn("fits", 148), ...Array.from({ length: 350 }, () => "// a line")].join("\n") + "\n",
    );
    // 501 lines, a function of 151, and a factory's inner arrow of 151 counted in it.
    writeFileSync(
      join(src, "over.ts"),
      [...fn("long", 149), ...Array.from({ length: 350 }, () => "// a line")].join("\n") + "\n",
    );
    writeFileSync(join(src, "over.test.ts"), fn("ignored", 400).join("\n"));
    const measured = measure(src);
    const named = (file: string) => measured.files.find((f) => f.file.endsWith(file))?.lines;
    expect(named("fits.ts")).toBe(500);
    expect(named("over.ts")).toBe(501);
    expect(named("over.test.ts")).toBeUndefined();
    const found = violations(measured, []);
    expect(found.map((v) => v.replace(/^.*src\//, ""))).toEqual([
      "over.ts: 501 lines (limit 500)",
      "over.ts#long: 151 lines (limit 150)",
    ]);
    // An exception names its file or function.
    const over = measured.files.find((f) => f.file.endsWith("over.ts"))!.file;
    expect(violations(measured, [over, `${over}#long`])).toEqual([]);
  });

  it("holds on this tree, with the exceptions docs/architecture.md lists (at most three)", () => {
    const allowed = exceptions();
    expect(allowed.length).toBeLessThanOrEqual(3);
    expect(violations(measure(), allowed)).toEqual([]);
  });
});
