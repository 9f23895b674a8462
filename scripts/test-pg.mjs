#!/usr/bin/env node
// Runs the test suite against a real PostgreSQL: each suite creates and drops
// its own fresh database on the server TEST_DATABASE_URL points at.
import { spawnSync } from "node:child_process";

const url = process.env.TEST_DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test";
const result = spawnSync("node_modules/.bin/vitest", ["run", ...process.argv.slice(2)], {
  stdio: "inherit",
  env: { ...process.env, TEST_DATABASE_URL: url },
});
process.exit(result.status ?? 1);
