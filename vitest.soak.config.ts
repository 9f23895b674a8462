import { defineConfig } from "vitest/config";

/** `npm run soak`: the soak across replicas (test/soak.soak.ts), on its own; see docs/operations.md. */
export default defineConfig({
  test: {
    include: ["test/**/*.soak.ts"],
    testTimeout: 60_000,
    hookTimeout: 180_000,
    pool: "forks",
    globalSetup: ["test/setup/build.ts", "test/setup/global-log-audit.ts"],
    setupFiles: ["test/setup/log-audit.ts"],
  },
});
