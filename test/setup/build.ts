import { buildIfStale } from "../../scripts/build.mjs";

/**
 * Tests that start the CLI as a process run the production build (dist/src/cli/main.js, see
 * test/helpers/processes.ts), as `npm start` and `npm run serve` do. It is built here, once per
 * run and before any test file starts, only when it is missing or older than the sources; the
 * build lock keeps two concurrent runs from building at once.
 */
export default function setup(): void {
  buildIfStale();
}
