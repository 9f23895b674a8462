import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";

declare module "vitest" {
  export interface ProvidedContext {
    logAuditDir: string;
  }
}

/** Gives the test files a directory for their audit counts and prints the total at the end. */
export default function setup(project: TestProject): () => void {
  const dir = mkdtempSync(join(tmpdir(), "gateway-log-audit-"));
  project.provide("logAuditDir", dir);
  return () => {
    let files = 0;
    let lines = 0;
    let leaks = 0;
    for (const name of readdirSync(dir)) {
      for (const row of readFileSync(join(dir, name), "utf8").split("\n")) {
        if (row === "") continue;
        const entry = JSON.parse(row) as { lines: number; leaks: number };
        files += 1;
        lines += entry.lines;
        leaks += entry.leaks;
      }
    }
    rmSync(dir, { recursive: true, force: true });
    process.stdout.write(
      `log audit: ${lines} log lines from ${files} test files checked for secrets; ${leaks} leaks\n`,
    );
  };
}
