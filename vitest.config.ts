import { configDefaults, defineConfig } from "vitest/config";

/**
 * Two projects (docs/contributors.md, "Tests"):
 * - `unit` (`npm test`, the README's command): the unit tests beside the sources and the
 *   integration suites of test/ that run the gateway in the test's own process, on embedded
 *   PGlite and anvil from npm. No services; under 5 minutes on 2 cores. `npm test` runs two
 *   files at a time (`--maxWorkers=2` in package.json): vitest's default on 2 cores is one, and
 *   these suites mostly wait (on anvil, PGlite, sockets). A flag given after it wins. A worker
 *   runs its files one after another in one process (`isolate: false`): each file loading the
 *   gateway's modules afresh was over a third of the suite's CPU (import 129 s of a 423 s run;
 *   issue 36). So a test file must not count on module state it did not set: process-wide
 *   hooks (the log audit, the OpenAPI check of answers, `recognizeDatabaseUnavailable`) are
 *   reset or written to be installed more than once.
 * - `e2e` (`npm run test:e2e`): test/e2e/, the suites whose subject is a process, a browser, a
 *   fault or a load: the built CLI and `gateway serve` as child processes, several gateways on
 *   one database, kills and restarts, the console in Chromium, the build itself, outages and
 *   timeouts of providers, chain and database, bursts of hostile requests; and the tests of time
 *   beside the sources (the `*.load.test.ts` files under src/: CPU and event-loop bounds on
 *   megabytes of one piece). One file at a time.
 * `npm run test:all` (and `.ci/run`) runs both.
 */
export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
    // Every test file's captured log lines are checked for the secrets it handed out.
    globalSetup: ["test/setup/build.ts", "test/setup/global-log-audit.ts"],
    // And every JSON answer a test gets from a gateway is checked against the OpenAPI document.
    setupFiles: ["test/setup/log-audit.ts", "test/setup/openapi-conformance.ts"],
    projects: [
      {
        extends: true,
        test: {
          name: "unit",
          include: ["src/**/*.test.ts", "test/*.test.ts", "contracts/**/*.test.ts"],
          exclude: [...configDefaults.exclude, "src/**/*.load.test.ts"],
          isolate: false,
        },
      },
      {
        extends: true,
        test: { name: "e2e", include: ["test/e2e/**/*.test.ts", "src/**/*.load.test.ts"] },
      },
    ],
  },
});
