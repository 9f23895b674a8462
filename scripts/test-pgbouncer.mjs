#!/usr/bin/env node
// The money suites with the gateway's pool going through PgBouncer in transaction pooling mode
// (issue 21): each test process starts one PgBouncer (test/helpers/pgbouncer.ts) in front of
// TEST_DATABASE_URL's server, and every test database is reached through it, the direct URL
// beside it for what needs a session (DATABASE_DIRECT_URL). Needs Debian's `pgbouncer`
// (/usr/sbin/pgbouncer, or PGBOUNCER_BIN); test/pgbouncer.test.ts says so when it is absent.
// Extra arguments go to vitest (e.g. one file).
import { spawnSync } from "node:child_process";

const files = [
  "test/pgbouncer.test.ts",
  "src/adapters/pg/ledger/ledger.test.ts",
  "src/adapters/pg/ledger/batch.test.ts",
  "src/adapters/pg/ledger/ledger.property.test.ts",
  "src/adapters/pg/leases.test.ts",
  "src/adapters/pg/idempotency.test.ts",
  "test/ledger-concurrency.test.ts",
  "test/e2e/lease-recall.test.ts",
  "test/e2e/leases-processes.test.ts",
  "test/idempotency-leases.test.ts",
  "test/idempotency-bound.test.ts",
  "test/settlement.test.ts",
  "test/settle-worker.test.ts",
  "test/e2e/settlement-processes.test.ts",
  "test/permit-balance-settlement.test.ts",
];
const url = process.env.TEST_DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test";
const args = process.argv.slice(2);
const result = spawnSync(
  "node_modules/.bin/vitest",
  ["run", "--maxWorkers=1", ...(args.some((a) => !a.startsWith("-")) ? args : [...files, ...args])],
  { stdio: "inherit", env: { ...process.env, TEST_DATABASE_URL: url, TEST_PGBOUNCER: "1" } },
);
process.exit(result.status ?? 1);
