import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["src/**/*.test.ts", "test/**/*.test.ts", "contracts/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
    // Every test file's captured log lines are checked for the secrets it handed out.
    globalSetup: ["test/setup/build.ts", "test/setup/global-log-audit.ts"],
    // And every JSON answer a test gets from a gateway is checked against the OpenAPI document.
    setupFiles: ["test/setup/log-audit.ts", "test/setup/openapi-conformance.ts"],
  },
});
