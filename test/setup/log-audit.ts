import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, expect, inject } from "vitest";
import { auditSize, findLeaks, resetAudit } from "../helpers/log-audit.js";

/**
 * After every test file: none of the secrets the file handed out appears in any log line it
 * captured. The counts go to the run's audit directory for the summary the global teardown prints.
 */
afterAll(() => {
  const { lines, secrets } = auditSize();
  const leaks = findLeaks();
  const dir = inject("logAuditDir");
  if (dir !== undefined && lines > 0) {
    appendFileSync(
      join(dir, `${process.pid}.jsonl`),
      `${JSON.stringify({ file: expect.getState().testPath ?? "", lines, secrets, leaks: leaks.length })}\n`,
    );
  }
  // The next test file of this worker starts with an empty audit (vitest.config.ts: the unit
  // project runs several files in one process).
  resetAudit();
  expect(leaks, "secrets found in log lines").toEqual([]);
});
